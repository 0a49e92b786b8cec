"""FLOP formulas for the aten ops torch's flop registry lacks (no torch needed).

``torch.utils.flop_counter.flop_registry`` covers matmuls, convolutions and
the CUDA attention kernels.  Everything else a training step runs is costed
here from shapes alone: pointwise math, normalisations, softmax, reductions,
pooling, embedding, losses, the CPU attention kernel and the optimizer
update.  Counts are per element of the tensor that bounds the work and are
approximate by design: these ops are memory bound on every device of the
table, so the roofline (:mod:`.devices`) is decided by their bytes, and the
FLOP count only has to be the right order.

Reading chosen where no source fixes a number: one FLOP per element for
arithmetic (add, mul, relu, where, ...), four for transcendental functions
(exp, tanh, sigmoid, gelu, ...); batch/layer/group norm 7 per element
forward, 12 backward; softmax 5 forward, 4 backward; Adam 12 per parameter
element; data movement ops (cat, copy, index, embedding gather) 0.

Example
-------
>>> formula_flops("aten.relu", [(4, 8)], [(4, 8)])
32
>>> formula_flops("aten._softmax", [(2, 10)], [(2, 10)])
100
>>> formula_flops("aten._scaled_dot_product_flash_attention_for_cpu",
...               [(1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)], [(1, 2, 4, 8)])
1184
"""

from __future__ import annotations

from math import prod

Shape = tuple[int, ...]

ARITH = frozenset("""
add sub mul div neg abs relu relu_ threshold threshold_backward where clamp clamp_min clamp_max maximum minimum
eq ne lt le gt ge logical_not logical_and bitwise_not fill fill_ masked_fill add_ mul_ sub_ div_ addcmul addcdiv
lerp leaky_relu leaky_relu_backward hardtanh hardtanh_backward sign reciprocal square remainder floor ceil round
rsub copy_ lt_ clone _to_copy
""".split())

TRANSCENDENTAL = frozenset("""
exp log tanh sigmoid gelu erf sqrt rsqrt pow sin cos silu mish softplus elu exp_ log1p expm1
tanh_backward sigmoid_backward gelu_backward silu_backward elu_backward softplus_backward pow_ sqrt_ rsqrt_
""".split())

NORMS_FWD = frozenset(("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                       "native_layer_norm", "native_group_norm", "_batch_norm_with_update",
                       "_native_batch_norm_legit_no_training", "rms_norm", "_fused_rms_norm"))
NORMS_BWD = frozenset(("native_batch_norm_backward", "native_layer_norm_backward", "native_group_norm_backward",
                       "batch_norm_backward", "_fused_rms_norm_backward"))
SOFTMAX_FWD = frozenset(("_softmax", "_log_softmax", "softmax", "log_softmax"))
SOFTMAX_BWD = frozenset(("_softmax_backward_data", "_log_softmax_backward_data"))
REDUCE = frozenset(("sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "prod", "norm",
                    "linalg_vector_norm", "argmax", "argmin", "logsumexp", "cumsum"))
POOL = frozenset(("max_pool2d_with_indices", "avg_pool2d", "max_pool2d_with_indices_backward",
                  "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
                  "adaptive_avg_pool2d", "max_pool3d_with_indices", "avg_pool3d"))
LOSS = frozenset(("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
                  "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
                  "binary_cross_entropy", "binary_cross_entropy_backward",
                  "binary_cross_entropy_with_logits"))
ATTN_FWD = frozenset(("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
                      "scaled_dot_product_attention", "_scaled_dot_product_fused_attention_overrideable"))
ATTN_BWD = frozenset(("_scaled_dot_product_flash_attention_for_cpu_backward",
                      "_scaled_dot_product_fused_attention_overrideable_backward"))
EMBED = frozenset(("embedding", "embedding_dense_backward", "index_select", "gather", "scatter_add",
                   "index_add", "index_put", "index", "_unsafe_index", "_unsafe_index_put", "embedding_bag"))
#: Ops eligible for tensor cores (matmul/convolution family, fused attention kernels).
TENSOR_CORE = frozenset(("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_convolution",
                         "matmul", "linear", "cudnn_convolution", "_slow_conv2d_forward", "_scaled_mm")
                        ) | ATTN_FWD | ATTN_BWD
#: FLOPs per parameter element of one Adam step (m, v, bias correction, update).
ADAM_FLOPS_PER_ELEMENT = 12


def numel(shape: Shape) -> int:
    return int(prod(shape)) if shape is not None else 0


def short(op: str) -> str:
    """``aten.relu.default`` / ``aten.relu`` -> ``relu``."""
    parts = op.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-1]


def attention_flops(q: Shape, k: Shape, v: Shape, backward: bool = False) -> int:
    """FLOPs of softmax(q k^T / sqrt(d)) v for ``[..., s, d]`` shapes.

    Forward: two batched matmuls (2 FLOPs per multiply-add) plus a softmax of
    5 per score.  Backward: the flash-attention recompute of the scores plus
    the four gradient matmuls, as in ``torch.utils.flop_counter
    .sdpa_backward_flop_count``, plus 4 per score for the softmax gradient.
    """
    batch = numel(q[:-2])
    s_q, d = q[-2], q[-1]
    s_k, d_v = k[-2], v[-1]
    scores = batch * s_q * s_k
    if not backward:
        return 2 * scores * d + 2 * scores * d_v + 5 * scores
    return 2 * scores * d + 2 * 2 * scores * d_v + 2 * 2 * scores * d + 4 * scores


def formula_flops(op: str, in_shapes: list[Shape], out_shapes: list[Shape], *,
                  kernel: Shape | None = None) -> int:
    """FLOPs of one aten op from its tensor shapes.

    Parameters
    ----------
    op : aten op name, with or without overload (``aten.gelu`` / ``aten.gelu.default``).
    in_shapes : shapes of the tensor arguments, in argument order.
    out_shapes : shapes of the tensor outputs.
    kernel : pooling window, when the op is a pooling op.

    Returns
    -------
    int, 0 for pure data movement and unknown ops (costed by bytes only).
    """
    name = short(op)
    out = max((numel(s) for s in out_shapes), default=0)
    inp = max((numel(s) for s in in_shapes), default=0)
    if name in ARITH:
        return out
    if name in TRANSCENDENTAL:
        return 4 * out
    if name in NORMS_FWD:
        return 7 * inp
    if name in NORMS_BWD:
        return 12 * inp
    if name in SOFTMAX_FWD:
        return 5 * out
    if name in SOFTMAX_BWD:
        return 4 * out
    if name in REDUCE:
        return inp
    if name in POOL:
        window = numel(kernel) if kernel else 1
        big = max(inp, out)
        small = min((numel(s) for s in in_shapes + out_shapes if numel(s) > 0), default=0)
        return max(small * window, big)
    if name in LOSS:
        return 3 * inp
    if name in ATTN_FWD and len(in_shapes) >= 3:
        return attention_flops(in_shapes[0], in_shapes[1], in_shapes[2])
    if name in ATTN_BWD and len(in_shapes) >= 4:
        # (grad_out, q, k, v, ...)
        return attention_flops(in_shapes[1], in_shapes[2], in_shapes[3], backward=True)
    if name == "embedding_dense_backward":
        return out if not in_shapes else numel(in_shapes[0])
    if name == "_fused_adam" or name == "adam":
        return ADAM_FLOPS_PER_ELEMENT * inp
    return 0


def is_tensor_core_op(op: str) -> bool:
    """True for matmul/convolution/fused-attention ops (they may run on tensor cores)."""
    return short(op) in TENSOR_CORE
