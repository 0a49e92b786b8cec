"""The shipped device table and the roofline cost model (no torch needed).

A node's time on a device type is the roofline of Williams et al. (2009):
the larger of the time to do its FLOPs at the device's peak rate and the
time to move its bytes at the device's memory bandwidth, plus one kernel
launch.  This is the "computation cost model" FastT (section 4, Cost
Models) keys by (operation, device), built here from datasheet numbers
instead of profiling, so any graph can be costed for every device type of
:data:`DEVICES` at once (``compute_by_type``); ``compute_s`` is the V100
time (the device of speed 1.0 in the Celeritas 6.2.1 testbed).

Peaks are vendor datasheet values for dense math.  ``fp32`` is the CUDA-core
rate (PyTorch does not use TF32 for fp32 matmuls by default); ``fp16`` and
``bf16`` are tensor-core rates where the part has them, and are used only for
matmul/convolution/attention ops on half-precision tensors (pointwise ops on
half tensors run at the fp32 rate, which hardly matters: they are memory
bound).

Tensor-core efficiency
----------------------
A pure roofline at the tensor-core peak runs the zoo's mixed-precision GPT
training steps at a model FLOPs utilisation of 72 % (1.3B) and 84 % (6.7B)
on one A100, which no training system reaches (matmuls at the peak leave
only the memory-bound ops to lose time).  Half-precision
matmul-class ops (matmuls, convolutions, fused attention) are therefore
charged at :data:`TENSOR_CORE_EFFICIENCY` = 0.60 of the tensor-core peak:
what fused attention kernels sustain over forward and backward
(FlashAttention-2, Dao 2023: 50-73 % of the A100 peak forward, less
backward) and below what cuBLAS reaches on large square GEMMs.  It is
calibrated, not measured: with the memory-bound ops (LayerNorm, GELU,
dropout, casts, the Adam update) at the memory bandwidth, the zoo's GPT
training steps then run on one simulated A100 at a model FLOPs utilisation
(:mod:`celeritas_cli.sim.mfu`) of 48.9 % (1.3B, batch 8) and 53.9 % (6.7B,
batch 16), on one H100 44.4 % and 51.4 %, and the 1.3B step in fp16 on one
V100 at 52.4 %: inside the published band, 41.5 % (22B) to 56.3 % (1T) on
A100-80GB with Megatron-LM's best plans (Korthikanti et al. 2022) and 48 %
for a 1.2B model on one V100 (Megatron-LM v1.0, the release after Shoeybi et
al. 2019), where a perfect plan of a real step should sit.
The fp32 path keeps the seed papers' roofline (efficiency 1: the zoo's fp32
costs are unchanged).

Example
-------
>>> round(roofline_time(14.0e12, 0, "V100") - DEVICES["V100"].launch_s, 6)
1.0
>>> sorted(DEVICES)[:3]
['2080Ti', '3060Ti', 'A100']
>>> t = roofline_time(312e12, 0, "A100", dtype="bfloat16", tensor_core_op=True)   # 312 TFLOP of bf16 matmul
>>> round((t - DEVICES["A100"].launch_s) * TENSOR_CORE_EFFICIENCY, 6)
1.0
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput

GB = 1.0e9
TFLOPS = 1.0e12
GiB = 1024**3


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers of one GPU model.

    Attributes
    ----------
    name : table key, also the cluster ``type`` it costs.
    fp32, fp16, bf16 : peak dense FLOP/s (``bf16`` 0 when unsupported).
    bandwidth_Bps : peak device-memory bandwidth, bytes/s.
    memory_bytes : device memory.
    launch_s : fixed per-kernel cost (launch + tail), added to every node.
    """

    name: str
    fp32: float
    fp16: float
    bf16: float
    bandwidth_Bps: float
    memory_bytes: int
    launch_s: float = 5.0e-6

    def peak(self, dtype: str, tensor_core_op: bool) -> float:
        """Peak FLOP/s for an op on *dtype* tensors."""
        if tensor_core_op and dtype in ("float16", "half"):
            return self.fp16 or self.fp32
        if tensor_core_op and dtype == "bfloat16":
            return self.bf16 or self.fp32
        return self.fp32

    def rate(self, dtype: str, tensor_core_op: bool) -> float:
        """The FLOP/s the roofline charges: :meth:`peak`, times :data:`TENSOR_CORE_EFFICIENCY` for a
        matmul-class op on half tensors that the part runs at a half-precision peak."""
        p = self.peak(dtype, tensor_core_op)
        half = tensor_core_op and dtype in ("float16", "half", "bfloat16") and p != self.fp32
        return p * TENSOR_CORE_EFFICIENCY if half else p

    def precision_peak(self, precision: str) -> float:
        """Datasheet peak of a graph's ``meta.precision`` (``fp32``/``bf16``/``fp16``): the denominator of
        model FLOPs utilisation (a part without bf16 falls back to its fp32 peak)."""
        return {"bf16": self.bf16, "fp16": self.fp16}.get(precision, 0.0) or self.fp32


#: Fraction of the fp16/bf16 tensor-core peak charged to half-precision matmul-class ops (module docstring).
TENSOR_CORE_EFFICIENCY = 0.60

#: Datasheet table (NVIDIA product briefs; PCIe parts where both exist, as in
#: the Celeritas testbed).  fp16 = tensor-core fp16 with fp32 accumulate, dense
#: (no 2:4 sparsity).  Sources: V100 PCIe 14 / 112 TFLOP/s (125 on SXM2; V100
#: datasheet 2020); P100 PCIe 9.3 / 18.7 (packed half on CUDA cores, no tensor
#: cores); T4 8.1 / 65; P4 5.5 (no fast fp16); RTX 2080 Ti 13.4 / 53.8 and RTX
#: 3060 Ti 16.2 / 32.4 fp16 and bf16 (GeForce: fp32-accumulate at half rate;
#: Turing / Ampere GA102 whitepapers); A100 19.5 / 312 fp16 and bf16 (A100
#: datasheet, both 40 and 80 GB); H100 SXM 67 / 989 fp16 and bf16 dense (H100
#: datasheet; 1979 is with sparsity).  bf16 0 = not supported (Volta, Turing,
#: Pascal): bf16 matmuls there run at the fp32 rate.
DEVICES: dict[str, DeviceSpec] = {
    "V100": DeviceSpec("V100", 14.0 * TFLOPS, 112.0 * TFLOPS, 0.0, 900 * GB, 32 * GiB),
    "P100": DeviceSpec("P100", 9.3 * TFLOPS, 18.7 * TFLOPS, 0.0, 732 * GB, 16 * GiB),
    "T4": DeviceSpec("T4", 8.1 * TFLOPS, 65.0 * TFLOPS, 0.0, 320 * GB, 16 * GiB),
    "P4": DeviceSpec("P4", 5.5 * TFLOPS, 5.5 * TFLOPS, 0.0, 192 * GB, 8 * GiB),
    "2080Ti": DeviceSpec("2080Ti", 13.4 * TFLOPS, 53.8 * TFLOPS, 0.0, 616 * GB, 11 * GiB),
    "3060Ti": DeviceSpec("3060Ti", 16.2 * TFLOPS, 32.4 * TFLOPS, 32.4 * TFLOPS, 448 * GB, 8 * GiB),
    "A100": DeviceSpec("A100", 19.5 * TFLOPS, 312.0 * TFLOPS, 312.0 * TFLOPS, 1555 * GB, 40 * GiB),
    "H100": DeviceSpec("H100", 67.0 * TFLOPS, 989.0 * TFLOPS, 989.0 * TFLOPS, 3350 * GB, 80 * GiB),
}

#: The device of speed 1.0: ``compute_s`` is its time (Celeritas 6.2.1 used V100s).
REFERENCE = "V100"


def spec(name: str) -> DeviceSpec:
    """The table entry for *name* (``InvalidInput`` naming the known ones)."""
    try:
        return DEVICES[name]
    except KeyError:
        raise InvalidInput(f"unknown device type {name!r}; known: {', '.join(sorted(DEVICES))}") from None


def roofline_time(flops: float, bytes_moved: float, device: str, *, dtype: str = "float32",
                  tensor_core_op: bool = False) -> float:
    """Seconds for one op on *device*: ``max(flops/rate, bytes/bandwidth) + launch``, where the
    rate is the peak (times :data:`TENSOR_CORE_EFFICIENCY` for half-precision matmul-class ops).

    Parameters
    ----------
    flops : floating-point operations of the op.
    bytes_moved : bytes read plus bytes written (inputs + outputs).
    device : a key of :data:`DEVICES`.
    dtype : element type of the op's main inputs (``float32``, ``float16``, ...).
    tensor_core_op : True for matmul/convolution ops (eligible for tensor cores).

    References
    ----------
    Williams, Waterman, Patterson, "Roofline", CACM 2009; FastT section 4
    (computation cost model per operation and device).
    """
    s = spec(device)
    return max(flops / s.rate(dtype, tensor_core_op), bytes_moved / s.bandwidth_Bps) + s.launch_s


def times_by_type(flops: float, bytes_moved: float, *, dtype: str = "float32",
                  tensor_core_op: bool = False, digits: int = 12) -> dict[str, float]:
    """:func:`roofline_time` on every device type of the table, rounded to *digits*."""
    return {name: round(roofline_time(flops, bytes_moved, name, dtype=dtype, tensor_core_op=tensor_core_op), digits)
            for name in DEVICES}


def device_type_of(name: str) -> str:
    """Map a CUDA device name (``torch.cuda.get_device_name``) to a table key.

    Example
    -------
    >>> device_type_of("Tesla V100-PCIE-32GB"), device_type_of("NVIDIA GeForce RTX 2080 Ti")
    ('V100', '2080Ti')
    >>> device_type_of("NVIDIA H200")
    'H200'
    """
    compact = name.upper().replace(" ", "").replace("-", "")
    for key in ("2080TI", "3060TI", "V100", "P100", "A100", "H100", "T4", "P4"):
        if key in compact:
            return {"2080TI": "2080Ti", "3060TI": "3060Ti"}.get(key, key)
    for token in reversed(name.replace("-", " ").split()):
        if any(ch.isdigit() for ch in token):
            return token
    return name
