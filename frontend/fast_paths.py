"""Decompositions of the fused ATen ops of torch's transformer fast paths.

In eval mode with gradients off, nn.TransformerEncoderLayer calls
`aten._transformer_encoder_layer_fwd` and nn.MultiheadAttention (self-attention,
batch_first, an even head count) `aten._native_multi_head_attention`: one kernel each
in eager, with no decomposition in torch. torch.export does not take these paths (its
tensors carry a torch function), but Dynamo does, so a graph torch.compile hands the
backend holds them. The importer rewrites them here into the ops they compute
(linear, matmul, softmax, layer norm), which the attention pass then fuses as it does
the slow path's SDPA.

Semantics are the fast paths' own, which eager runs: a float mask is a boolean one
(non-zero: masked out); a query row whose keys are all masked gives NaN, as the fused
kernel's softmax does (the slow path's SDPA gives 0 there); Q is scaled by
1/sqrt(head size) before Q K^T. Mask types (nn.MultiheadAttention.merge_masks): 0 an
[L, S] attention mask, 1 a [B, S] key padding mask, 2 a mask of [B, heads, L, S].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812

aten = torch.ops.aten


def _additive_mask(mask: torch.Tensor, mask_type: int | None, batch: int, queries: int,
                   keys: int) -> torch.Tensor:
    """-inf where the fast path masks a score out, else 0, broadcastable to the scores
    [B, heads, L, S] (added to them: the form the attention pass fuses)."""
    masked = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == 0:
        masked = masked.reshape(1, 1, queries, keys)
    elif mask_type == 1:
        masked = masked.reshape(batch, 1, 1, keys)
    return torch.where(masked, float("-inf"), 0.0)


def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                embed_dim: int, num_head: int, qkv_weight: torch.Tensor,
                                qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                                proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """aten._native_multi_head_attention: (output, attention weights: averaged over the
    heads, per head, or an empty tensor when not needed)."""
    batch, queries, keys = query.shape[0], query.shape[1], key.shape[1]
    head = embed_dim // num_head
    if query is key and key is value:  # self-attention: one projection GEMM for Q, K, V
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        weights, biases = qkv_weight.chunk(3, dim=0), qkv_bias.chunk(3, dim=0)
        q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases,
                                                       strict=True))

    def heads(x: torch.Tensor, length: int) -> torch.Tensor:
        return x.reshape(batch, length, num_head, head).transpose(1, 2)

    scores = (heads(q, queries) * (1.0 / math.sqrt(head))) @ heads(k, keys).transpose(-2, -1)
    if mask is not None:
        scores = scores + _additive_mask(mask, mask_type, batch, queries, keys)
    probs = torch.softmax(scores, dim=-1)
    context = (probs @ heads(v, keys)).transpose(1, 2).reshape(batch, queries, embed_dim)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, query.new_empty(0)
    return out, probs.mean(dim=1) if average_attn_weights else probs


def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int,
                                  qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                  proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float,
                                  norm_weight_1: torch.Tensor, norm_bias_1: torch.Tensor,
                                  norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor,
                                  ffn_weight_2: torch.Tensor, ffn_bias_2: torch.Tensor,
                                  mask: torch.Tensor | None = None,
                                  mask_type: int | None = None) -> torch.Tensor:
    """aten._transformer_encoder_layer_fwd: self-attention and a two-layer ReLU or
    (exact) GELU feed-forward block, each added to its input, layer norms before
    (norm_first) or after them."""
    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                    proj_weight, proj_bias, mask, False, True, mask_type)[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    before_ffn = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + before_ffn
    return norm(x, norm_weight_2, norm_bias_2) if not norm_first else x


DECOMPOSITIONS = {
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
