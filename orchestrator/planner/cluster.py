"""What the planner is told about the hardware, the model, the job, and how efficiently code runs on it.

These four specs are the fixed context of a plan: nothing in them is a throughput knob. Units in field
names are the ones a preset is written in (TFLOP/s, GB = 1e9 bytes, GB/s, microseconds); the ``*_si``
properties give plain SI values to the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checks import check_bool, check_choice, check_int, check_num, prefixed

PRECISIONS = ("mixed", "fp32", "bf16_autocast")
EFFICIENCY_BASES = {
    "prior": "starting guesses, not fitted to anything",
    "blind": "datasheet hardware + an efficiency set fitted on other runs (another GPU generation's published "
             "runs, transferred); nothing of the target's own timeline went in",
    "calibrated": "solved from the very timeline being predicted (e.g. the article's 12 s = 8 + 4): it "
                  "reproduces that timeline by construction, so it is not a prediction of it",
    "fitted": "fitted to measured or published runs on this hardware (python -m orchestrator calibrate, or a "
              "corpus fit set)",
}
"""Where an efficiency set's values come from; reports and exports name it next to every predicted answer."""


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous GPU cluster: per-GPU compute and memory, and two tiers of network."""

    name: str = "cluster"
    """Free text, shown in reports."""
    num_gpus: int = 8
    """GPUs in the job; tp * pp * dp must equal it."""
    gpus_per_node: int = 8
    """GPUs sharing the fast intra-node fabric (NVLink domain); tensor parallelism up to this size stays on it."""
    peak_tflops: float = 989.0
    """Dense BF16 peak per GPU (vendor figure). MFU is quoted against it."""
    hbm_gb: float = 80.0
    """GPU memory per GPU, GB (1e9 bytes). A config fits when its peak stage needs no more than this."""
    hbm_bw_GBps: float = 3350.0
    """HBM bandwidth per GPU; prices the memory-bound optimizer step."""
    intra_node_bw_GBps: float = 450.0
    """Intra-node bandwidth per GPU per direction (NVLink), GB/s."""
    intra_node_latency_us: float = 3.0
    """Per-hop latency on the intra-node fabric (alpha of the alpha-beta model)."""
    inter_node_bw_GBps: float = 50.0
    """Inter-node bandwidth per GPU per direction (the node's NIC bandwidth divided by its GPUs), GB/s."""
    inter_node_latency_us: float = 8.0
    """Per-hop latency between nodes."""

    def __post_init__(self) -> None:
        with prefixed("cluster"):
            if not isinstance(self.name, str) or not self.name:
                raise ValueError("name: must be a non-empty string")
            check_int(self, "num_gpus", 1)
            check_int(self, "gpus_per_node", 1)
            for f in ("peak_tflops", "hbm_gb", "hbm_bw_GBps", "intra_node_bw_GBps", "inter_node_bw_GBps"):
                check_num(self, f, lo=0.0, lo_open=True)
            check_num(self, "intra_node_latency_us", lo=0.0)
            check_num(self, "inter_node_latency_us", lo=0.0)

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9


@dataclass(frozen=True)
class ElementwiseBytes:
    """HBM bytes per element that a layer's memory-bound elementwise kernels move, with 16-bit activations
    (fp32 activations move twice these). The defaults are Megatron's fused kernels; a stack that runs them
    unfused states its own (``eager_llama`` counts torchtitan's eager Llama block)."""

    forward_h: float = 22.0
    """Per element of the h-wide activation, forward: 2 LayerNorms (read x, write y: 4 each) and 2 fused
    bias-dropout-adds (read input and residual, write output and a 1-byte mask: 7 each)."""
    backward_h: float = 34.0
    """The same, backward: 2 LayerNorms (read x and dy, write dx: 6), 2 bias-dropout-adds (read dy and mask,
    write dx: 5) and the 2 residual-gradient sums (read 2, write 1: 6)."""
    forward_ffn: float = 4.0
    """Per element of the ffn-wide MLP activation, forward: the fused bias-GeLU reads and writes it."""
    backward_ffn: float = 6.0
    """The same, backward: read input and dy, write dx."""

    def __post_init__(self) -> None:
        with prefixed("model.elementwise"):
            for f in ("forward_h", "backward_h", "forward_ffn", "backward_ffn"):
                check_num(self, f, lo=0.0)


RMSNORM_EAGER = (36.0, 64.0)
"""Bytes per element, forward and backward, of torchtitan's python RMSNorm on a bf16 tensor (x.float(): 2 + 4;
pow: 4 + 4; mean: 4; x * rsqrt: 4 + 4; type_as: 4 + 2; * weight: 2 + 2), and its autograd mirror (the weight
product's two gradients 8, the casts 6 each, the rsqrt product's two 8 each, mean's expand 4, pow's 12, and the
sum of the two paths into dx 12)."""
ADD_EAGER = (6.0, 6.0)
"""A residual add (read 2, write 1) and, backward, the sum of the two gradient paths into the residual stream."""
ROPE_EAGER = (20.0, 20.0)
"""Rotary embedding in complex fp32 per element of q and k: x.float() 2 + 4, the complex product 4 + 4,
type_as 4 + 2; its backward the same."""
COPY_EAGER = 4.0
"""A contiguous copy of a bf16 tensor (read 2, write 2): the attention output's transpose back, each way."""
SWIGLU_EAGER = (10.0, 18.0)
"""Per element of the gated width: silu (2 + 2) and the product (read 4, write 2); backward the product's two
gradients (12) and silu's (read input and dy, write dx: 6)."""


def eager_llama(hidden: int, kv_width: int, gated_ffn: int, ffn: int) -> ElementwiseBytes:
    """torchtitan's Llama block run eagerly (``compile = false``, ``norm_type = rmsnorm``): one kernel per op.

    Per element of h: 2 RMSNorms, 2 residual adds, RoPE on q (h) and k (``kv_width``), the attention output's
    transpose copy, and repeat_kv's k and v copies when there are fewer KV heads; per element of the planner's
    equivalent MLP width ``ffn``: SwiGLU on ``gated_ffn`` elements. Dropout is off in these runs (no masks).
    """
    kv = kv_width / hidden
    # k and v each: read kv_width elements, write h (backward: the reverse), 2 bytes each way.
    repeat = 2 * (2 * kv + 2) if kv_width < hidden else 0.0
    fwd_h = 2 * RMSNORM_EAGER[0] + 2 * ADD_EAGER[0] + ROPE_EAGER[0] * (1 + kv) + COPY_EAGER + repeat
    bwd_h = 2 * RMSNORM_EAGER[1] + 2 * ADD_EAGER[1] + ROPE_EAGER[1] * (1 + kv) + COPY_EAGER + repeat
    g = gated_ffn / ffn
    return ElementwiseBytes(forward_h=fwd_h, backward_h=bwd_h, forward_ffn=SWIGLU_EAGER[0] * g,
                            backward_ffn=SWIGLU_EAGER[1] * g)


@dataclass(frozen=True)
class ModelSpec:
    """A dense GPT decoder (Megatron's GPT: pre-LayerNorm blocks, MHA, two-matrix MLP, separate LM head)."""

    num_layers: int = 24
    """Transformer blocks."""
    hidden_size: int = 2048
    """Model width h."""
    num_heads: int = 16
    """Attention heads a; must divide h and be divisible by tp."""
    ffn_hidden_size: int = 0
    """MLP inner width; 0 means 4h (the GPT default the Korthikanti et al. formulas assume)."""
    vocab_size: int = 51200
    """Vocabulary V (padded as the run pads it)."""
    tied_embeddings: bool = False
    """Input embedding and LM head share weights. Either way the last stage holds an LM-head matrix
    (Megatron keeps a copy there when pp > 1); tying only changes the parameter count."""
    flash_attention: bool = True
    """Fused attention (FlashAttention / TE): no s*s score tensors are stored, and causal masking skips
    half the score FLOPs. False models the 2021-22 unfused kernels (Korthikanti et al.'s 5as^2b term)."""
    linear_biases: bool = True
    """The four GEMMs of a layer carry biases (Megatron's GPT does; the steptune trainer's model does not).
    Only the parameter count changes."""
    position_embeddings: int = 0
    """Rows of a learned absolute position table held with the input embedding on the first stage
    (GPT-2 style; the steptune trainer uses seq_len rows); 0 for rotary or no position parameters."""
    elementwise: ElementwiseBytes = field(default_factory=ElementwiseBytes)
    """HBM bytes per element of the layer's elementwise kernels (LayerNorm, activation, residual): Megatron's
    fused kernels by default; an eager PyTorch stack moves several times more."""
    layer_gemms: tuple[tuple[int, int], ...] = ()
    """The layer's GEMMs in forward order as [input width, output width] pairs; empty: Megatron's four, QKV
    [h, 3h], attention projection [h, h], FC1 [h, ffn], FC2 [ffn, h] (also the steptune trainer's). Only
    op-level recompute reads the order (which outputs it keeps); the pairs' products must add up to the
    layer's GEMM weights, 4h^2 + 2h*ffn, e.g. a Llama block's wq, wk, wv, wo, w1, w3, w2 with ffn its
    equivalent width."""

    def __post_init__(self) -> None:
        if isinstance(self.layer_gemms, list):
            object.__setattr__(self, "layer_gemms", tuple(tuple(g) for g in self.layer_gemms))
        with prefixed("model"):
            for f in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
                check_int(self, f, 1)
            check_int(self, "ffn_hidden_size", 0)
            check_int(self, "position_embeddings", 0)
            check_bool(self, "tied_embeddings")
            check_bool(self, "flash_attention")
            check_bool(self, "linear_biases")
            if self.hidden_size % self.num_heads:
                raise ValueError(f"num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")
            g = self.layer_gemms
            if any(len(p) != 2 or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in p) for p in g):
                raise ValueError(f"layer_gemms: {g!r} must list [input width, output width] pairs of positive "
                                 "integers")
            if g and sum(i * o for i, o in g) != self.matmul_params_per_layer:
                raise ValueError(f"layer_gemms: the GEMM weights add up to {sum(i * o for i, o in g)}, not the "
                                 f"layer's 4h^2 + 2h*ffn = {self.matmul_params_per_layer}; list every GEMM of "
                                 "the layer, or set ffn_hidden_size to its equivalent width")

    @property
    def gemms(self) -> tuple[tuple[int, int], ...]:
        """``layer_gemms``, or Megatron's four when it is empty."""
        h, f = self.hidden_size, self.ffn
        return self.layer_gemms or ((h, 3 * h), (h, h), (h, f), (f, h))

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def matmul_params_per_layer(self) -> int:
        """4h^2 (QKV + projection) + 2h*ffn (MLP): the weights GEMMs read."""
        h, f = self.hidden_size, self.ffn
        return 4 * h * h + 2 * h * f

    @property
    def params_per_layer(self) -> int:
        """GEMM weights + two LayerNorms (4h) + the GEMMs' biases (5h + ffn) when there are any.

        With ffn = 4h and biases this is Narayanan et al. (2021) eq. 2's per-layer 12h^2 + 13h.
        """
        h, f = self.hidden_size, self.ffn
        return self.matmul_params_per_layer + 4 * h + ((5 * h + f) if self.linear_biases else 0)

    @property
    def tp_replicated_per_layer(self) -> int:
        """Per-layer parameters every tensor-parallel rank holds whole: the two LayerNorms (4h) and the
        row-parallel GEMMs' output biases (2h, when there are biases); Megatron shards only the GEMM weights
        and the column-parallel biases."""
        return 4 * self.hidden_size + (2 * self.hidden_size if self.linear_biases else 0)

    @property
    def tensors_per_layer(self) -> int:
        """Parameter tensors per layer: 4 weight matrices, 2 LayerNorms of 2, and 4 bias vectors if any.

        torch's AdamW keeps a 4-byte step counter per tensor, which is all this count is for."""
        return 8 + (4 if self.linear_biases else 0)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        positions = self.position_embeddings * self.hidden_size
        return (self.num_layers * self.params_per_layer + self.embedding_params + head + 2 * self.hidden_size
                + positions)


@dataclass(frozen=True)
class JobSpec:
    """The fixed work of one update besides the batch (``batch.global_batch``, a shared knob section).
    Changing a field changes the training run, not its speed."""

    seq_len: int = 2048
    """Tokens per sequence."""
    precision: str = "mixed"
    """How numbers are stored, which sets the bytes of every memory term:
    mixed - Megatron's bf16 training: bf16 weights and activations, fp32 main gradients (or bf16, see
    optimizer.grad_reduce_dtype) and fp32 master weights + Adam moments (12 bytes per parameter);
    fp32 - plain fp32 training (the steptune trainer's default): 4-byte weights and gradients, 8-byte
    Adam moments plus torch's 4-byte step counter per tensor, every activation 4 bytes;
    bf16_autocast - the steptune trainer's run.precision=bf16: fp32 weights, gradients and Adam state as in
    fp32, 2-byte activations, plus the bf16 copy of each weight a GEMM saves for backward per microbatch
    (the trainer turns autocast's weight cache off). Changes what is trained, so it is not a knob."""

    def __post_init__(self) -> None:
        with prefixed("job"):
            check_int(self, "seq_len", 1)
            check_choice(self, "precision", PRECISIONS)


@dataclass(frozen=True)
class Efficiency:
    """How close the software gets to the hardware: the calibrated parameters of the model.

    Defaults are priors, not measurements; ``calibrate`` fits them to measured runs, and a preset
    states where its values come from.
    """

    matmul_eff: float = 0.6
    """Fraction of peak FLOP/s that large transformer GEMMs achieve."""
    gemm_tokens_half: float = 256.0
    """Tokens per microbatch (b*s) at which GEMM efficiency is half of matmul_eff: small microbatches
    give skinny GEMMs (Narayanan et al. 2021, Sec. 5.5: arithmetic intensity grows with microbatch size)."""
    attention_eff: float = 0.4
    """Fraction of peak that the attention core (QK^T, softmax, AV) achieves."""
    flash_attention_eff: float | None = None
    """Fraction of peak the fused (FlashAttention) attention core achieves; used instead of attention_eff
    when model.flash_attention is on (None: attention_eff serves both). Prior from FlashAttention-2 (Dao 2023): 50-73% of A100 peak forward +
    backward, about 35-40% of H100's; the unfused 2021-22 kernels that attention_eff is fitted on are much
    slower, so the two are kept apart."""
    op_overhead_us: float = 0.0
    """Fixed cost per layer per pass (kernel launches, synchronisation), microseconds."""
    tp_bw_eff: float = 0.7
    """Achieved fraction of link bandwidth for tensor-parallel collectives."""
    pp_bw_eff: float = 0.7
    """Achieved fraction of link bandwidth for pipeline point-to-point sends."""
    dp_bw_eff: float = 0.7
    """Achieved fraction of link bandwidth for data-parallel collectives when every replica group
    communicates at once (fabric contention lowers it at scale)."""
    collective_latency_us: float = 0.0
    """Fixed cost of one collective or send besides the link's latency per hop, microseconds: the launch and the
    framework's dispatch (a DDP bucket hook, a Python call into gloo). Every message pays it once, so n
    data-parallel buckets pay it n times. About 0 for NCCL from C++ (the hop latency covers it); fitted from
    2-rank data-parallel slices at two bucket sizes (``steptune profile``), near 1000 for gloo buckets on a
    loaded 2-core host."""
    dp_latency_us: float | None = None
    """Latency of one data-parallel bucket's collective as the trainer's own buckets pay it (the hook, the
    dispatch, the rendezvous of the ranks), microseconds, in place of the link's hops x latency +
    collective_latency_us for DP buckets; fitted by ``steptune profile`` from 2-rank data-parallel slices at two
    or more bucket sizes. None: priced from the link."""
    pp_latency_us: float | None = None
    """Latency of one pipeline send as the trainer's schedule pays it (the send and receive calls, their
    dispatch, the peer's rendezvous), microseconds, in place of the link's latency + collective_latency_us; fitted
    by ``steptune profile`` from 2-stage pipeline slices at two microbatch counts. None: priced from the link."""
    pass_overhead_us: float = 0.0
    """Fixed cost of one microbatch's forward or backward pass through a model chunk besides its layers'
    (the schedule's call, autograd's start, the embedding and loss kernels' launches), microseconds. About 0 on
    a GPU stack (it hides behind the kernels); hundreds on a CPU host, where Python runs every op in line."""
    optimizer_tensor_us: float = 0.0
    """Fixed cost per parameter tensor of one optimizer step (a non-fused optimizer's per-tensor loop), microseconds."""
    step_overhead_us: float = 0.0
    """Fixed cost of one update outside its passes and buckets (zeroing the gradients, the loss and gradient-norm
    reductions, the optimizer's launch), microseconds; counted in ``optimizer_s``."""
    dp_overlap_eff: float = 1.0
    """Fraction of the compute window under which overlapped data-parallel buckets progress: 1 where the
    collectives run on their own engine beside the compute (NCCL on GPUs); less where they compete with it for
    the same cores (gloo threads beside CPU compute). Fitted from 2-rank slices with overlap on and off."""
    elementwise_bw_eff: float = 0.8
    """Achieved fraction of HBM bandwidth in streaming elementwise kernels (LayerNorm, bias-dropout-add,
    GeLU). A stated value, not fitted: large contiguous copies reach 80-90% of the HBM datasheet figure on
    A100/H100 (device-to-device bandwidth tests); 0.8 leaves room for the kernels' reductions."""
    optimizer_bw_eff: float = 0.5
    """Achieved fraction of HBM bandwidth in the (memory-bound) optimizer step."""
    mem_reserved_gb: float = 5.0
    """Per-GPU memory outside the model: CUDA context, NCCL and cuBLAS workspaces, allocator slack."""
    mem_activation_factor: float = 1.0
    """Multiplier on the Korthikanti et al. activation bytes (allocator fragmentation, small tensors)."""
    basis: str = "prior"
    """Where these values come from: prior | blind | calibrated | fitted (see EFFICIENCY_BASES). A label, not
    a parameter: the sweep summary and export say which kind of set produced a predicted answer."""
    basis_note: str = ""
    """Free text naming the source of the values (fit set, transferred from which generation, solved from
    what), shown next to the basis."""

    def __post_init__(self) -> None:
        with prefixed("efficiency"):
            check_choice(self, "basis", tuple(EFFICIENCY_BASES))
            if not isinstance(self.basis_note, str):
                raise ValueError(f"basis_note: must be a string, got {self.basis_note!r}")
            for f in ("matmul_eff", "attention_eff", "tp_bw_eff", "pp_bw_eff", "dp_bw_eff", "optimizer_bw_eff",
                      "elementwise_bw_eff"):
                check_num(self, f, lo=0.0, hi=1.0, lo_open=True)
            if self.flash_attention_eff is not None:
                check_num(self, "flash_attention_eff", lo=0.0, hi=1.0, lo_open=True)
            check_num(self, "gemm_tokens_half", lo=0.0)
            check_num(self, "op_overhead_us", lo=0.0)
            check_num(self, "collective_latency_us", lo=0.0)
            check_num(self, "dp_overlap_eff", lo=0.0, hi=1.0)
            for f in ("dp_latency_us", "pp_latency_us"):
                if getattr(self, f) is not None:
                    check_num(self, f, lo=0.0)
            for f in ("pass_overhead_us", "optimizer_tensor_us", "step_overhead_us"):
                check_num(self, f, lo=0.0)
            check_num(self, "mem_reserved_gb", lo=0.0)
            check_num(self, "mem_activation_factor", lo=0.5, hi=4.0)
