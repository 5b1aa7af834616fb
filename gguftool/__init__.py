"""gguftool: requantize LLMs to HQQ / TurboQuant GGUF types and prove them in a native llama.cpp build."""
__version__ = "0.1.0"
