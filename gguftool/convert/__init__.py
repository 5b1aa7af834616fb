"""Hugging Face checkpoint directories -> GGUF (llama family, Qwen2/Qwen3, BERT).

archs   which HF classes map to which llama.cpp architecture; hyperparameters; q/k permutation
vocab   tokenizer.json -> GGUF tokenizer metadata (gguf's SpecialVocab for merges and special ids)
model   HFModel: the checkpoint as a lazy, tensor-by-tensor source for the quantize pipeline
"""
from .archs import SUPPORTED
from .model import HFModel, open_model

__all__ = ["SUPPORTED", "HFModel", "open_model"]
