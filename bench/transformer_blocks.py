"""Small transformers written from their papers' and model cards' descriptions for the benches
(no code of transformers or the authors' repositories), exported as optimum exports them: the
TorchScript exporter, batch and sequence dims dynamic and named as optimum names them.

    text_encoder      RoBERTa's shape: word, position (counted over the mask) and type embeddings,
                      post-norm layers of attention (an additive mask of finfo.min) and a GELU MLP
    audio_encoder     Wav2Vec2's shape: a Conv1d feature extractor over a waveform (GroupNorm on
                      its first layer), a projection, a grouped positional Conv1d, post-norm layers
    decoder_with_past Qwen2's shape: RMSNorm computed in float32, rotary position embeddings,
                      grouped-query attention over a key/value cache given as inputs, a causal
                      mask beside the padding mask, a SwiGLU MLP, the cache returned as outputs

Random weights, every one perturbed (no bias zero, no norm the identity), in eval mode. Each
`export_*` writes the ONNX file and returns its path; `working_sizes(name)` gives the dynamic
dims a deployment runs them at, beside the 1s convexport makes up.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, LAYERS, FFN = 64, 4, 2, 128
VOCAB, POSITIONS = 1000, 64


def _perturbed(model: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model.eval()


class _SelfAttention(nn.Module):
    """Multi-head attention of a tensor over itself, with an additive mask [B, 1, 1, S]."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))

    def forward(self, h, mask):
        b, s, _ = h.shape

        def heads(t):
            return t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)

        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HIDDEN // HEADS) + mask
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HIDDEN)
        return self.o(context)


class _PostNormLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = _SelfAttention()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, h, mask):
        h = self.norm1(h + self.attention(h, mask))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


class TextEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.words, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
        self.types, self.norm = nn.Embedding(1, HIDDEN), nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(_PostNormLayer() for _ in range(LAYERS))

    def forward(self, input_ids, attention_mask):
        # positions count the tokens that are not padding, from 2 (RoBERTa's padding index is 1)
        kept = input_ids.ne(1).int()
        positions = (torch.cumsum(kept, dim=1) * kept).long() + 1
        h = self.words(input_ids) + self.positions(positions) + self.types(torch.zeros_like(input_ids))
        h = self.norm(h)
        mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, mask)
        return h


class AudioEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        channels = 32
        self.conv0 = nn.Conv1d(1, channels, 10, stride=5, bias=False)
        self.norm0 = nn.GroupNorm(channels, channels)
        self.conv1 = nn.Conv1d(channels, channels, 3, stride=2, bias=False)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, bias=False)
        self.feature_norm, self.projection = nn.LayerNorm(channels), nn.Linear(channels, HIDDEN)
        self.position = nn.Conv1d(HIDDEN, HIDDEN, 16, padding=8, groups=4)
        self.norm = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(_PostNormLayer() for _ in range(LAYERS))

    def forward(self, input_values):
        x = F.gelu(self.norm0(self.conv0(input_values[:, None])))
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        h = self.projection(self.feature_norm(x.transpose(1, 2)))
        position = F.gelu(self.position(h.transpose(1, 2))[:, :, :-1])  # an even kernel pads one frame too many
        h = self.norm(h + position.transpose(1, 2))
        mask = torch.zeros(1, 1, 1, 1, dtype=h.dtype)
        for layer in self.layers:
            h = layer(h, mask)
        return h


KV_HEADS, HEAD_SIZE, THETA = 2, HIDDEN // HEADS, 10000.0


class _RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_norm, self.post_norm = _RMSNorm(), _RMSNorm()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_SIZE)
        self.k = nn.Linear(HIDDEN, KV_HEADS * HEAD_SIZE)
        self.v = nn.Linear(HIDDEN, KV_HEADS * HEAD_SIZE)
        self.o = nn.Linear(HEADS * HEAD_SIZE, HIDDEN, bias=False)
        self.gate, self.up = nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, h, cos, sin, mask, past_key, past_value):
        b, s, _ = h.shape
        x = self.input_norm(h)
        q = self.q(x).view(b, s, HEADS, HEAD_SIZE).transpose(1, 2)
        k = self.k(x).view(b, s, KV_HEADS, HEAD_SIZE).transpose(1, 2)
        v = self.v(x).view(b, s, KV_HEADS, HEAD_SIZE).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        key, value = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        repeat = HEADS // KV_HEADS
        keys = key[:, :, None].expand(b, KV_HEADS, repeat, key.shape[2], HEAD_SIZE).reshape(b, HEADS, -1, HEAD_SIZE)
        values = value[:, :, None].expand(b, KV_HEADS, repeat, key.shape[2], HEAD_SIZE).reshape(b, HEADS, -1, HEAD_SIZE)
        scores = q @ keys.transpose(2, 3) / math.sqrt(HEAD_SIZE) + mask
        context = (scores.softmax(-1) @ values).transpose(1, 2).reshape(b, s, HEADS * HEAD_SIZE)
        h = h + self.o(context)
        x = self.post_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x)), key, value


class DecoderWithPast(nn.Module):
    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(_DecoderLayer() for _ in range(LAYERS))
        self.norm, self.head = _RMSNorm(), nn.Linear(HIDDEN, VOCAB, bias=False)
        self.register_buffer("inverse_frequency", 1.0 / THETA ** (torch.arange(0, HEAD_SIZE, 2).float() / HEAD_SIZE))

    def forward(self, input_ids, attention_mask, position_ids, *past):
        h = self.words(input_ids)
        angles = position_ids[:, :, None].float() * self.inverse_frequency[None, None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        s, total = input_ids.shape[1], attention_mask.shape[1]
        queries = torch.arange(s)[:, None] + (total - s)
        causal = torch.arange(total)[None, :] <= queries  # [S, P + S]
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.zeros_like(allowed, dtype=h.dtype).masked_fill(~allowed, torch.finfo(h.dtype).min)
        present = []
        for index, layer in enumerate(self.layers):
            h, key, value = layer(h, cos, sin, mask, past[2 * index], past[2 * index + 1])
            present += [key, value]
        return (self.head(self.norm(h)), *present)


BLOCKS = {"text_encoder": TextEncoder, "audio_encoder": AudioEncoder, "decoder_with_past": DecoderWithPast}


def _examples(name: str) -> tuple[tuple, list[str], list[str], dict]:
    """(example inputs, input names, output names, dynamic axes) as optimum names them."""
    batch, sequence = 2, 7
    if name == "text_encoder":
        ids = torch.randint(2, VOCAB, (batch, sequence), generator=torch.Generator().manual_seed(0))
        dims = {0: "batch_size", 1: "sequence_length"}
        names = ["input_ids", "attention_mask"]
        axes = dict.fromkeys([*names, "last_hidden_state"], dims)
        return (ids, torch.ones_like(ids)), names, ["last_hidden_state"], axes
    if name == "audio_encoder":
        dims = {0: "batch_size", 1: "sequence_length"}
        return (
            (torch.randn(batch, 1600),),
            ["input_values"],
            ["last_hidden_state"],
            {
                "input_values": dims,
                "last_hidden_state": {0: "batch_size", 1: "frames"},
            },
        )
    past = 3
    ids = torch.randint(0, VOCAB, (batch, sequence), generator=torch.Generator().manual_seed(0))
    cache = [torch.randn(batch, KV_HEADS, past, HEAD_SIZE) for _ in range(2 * LAYERS)]
    cache_names = [f"past_key_values.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    present_names = [name.replace("past_key_values", "present") for name in cache_names]
    total = "past_sequence_length + sequence_length"
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: total},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{name: {0: "batch_size", 2: "past_sequence_length"} for name in cache_names},
        **{name: {0: "batch_size", 2: total} for name in present_names},
    }
    args = (
        ids,
        torch.ones(batch, past + sequence, dtype=torch.long),
        torch.arange(past, past + sequence)[None].expand(batch, sequence).clone(),
        *cache,
    )
    return args, ["input_ids", "attention_mask", "position_ids", *cache_names], ["logits", *present_names], axes


def export(name: str, folder: Path, opset: int = 17) -> Path:
    """The block as optimum exports it (TorchScript, dims dynamic and named), in `folder`."""
    torch.manual_seed(0)
    model = _perturbed(BLOCKS[name](), seed=1)
    args, inputs, outputs, axes = _examples(name)
    path = Path(folder) / f"{name}.onnx"
    torch.onnx.export(
        model, args, str(path), dynamo=False, opset_version=opset, input_names=inputs, output_names=outputs,
        dynamic_axes=axes,
    )  # fmt: skip
    return path


def working_sizes(name: str) -> list[dict[str, int]]:
    """Dynamic dims a deployment runs each block at (by dim name)."""
    if name == "text_encoder":
        return [{"batch_size": 1, "sequence_length": 32}, {"batch_size": 8, "sequence_length": 48}]
    if name == "audio_encoder":
        return [{"batch_size": 2, "sequence_length": 1600}, {"batch_size": 1, "sequence_length": 16000}]
    total = "past_sequence_length + sequence_length"
    return [  # one token after a cache of 31; a prompt of 16 with no cache
        {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 31, total: 32},
        {"batch_size": 1, "sequence_length": 16, "past_sequence_length": 0, total: 16},
    ]
