"""File formats: GGUF read/write (upstream and gguftool types), Hugging Face checkpoints, hub downloads."""
