"""How much host memory a training step takes, estimated before the first
step, and the refusal of a step that cannot fit.

On the CPU a step larger than the machine's memory is not an error:
the operating system's OOM killer ends the process mid-run (exit status
137) and nothing says why. `keras-vit train --model ViTTi16 --data
folder:DIGITS --epochs 3` (the finetune recipe's 384 px and batches of
hundreds of images) was killed so on a 24 GB machine. `check_host_memory`
refuses such a run before the first step, naming the batch that fits.

The estimate counts what a training step keeps for its backward pass, per
image, from the model's own layers, plus the gradients and optimizer slots:

- a `TransformerBlock` of `T` tokens, width `D`, `H` heads and MLP width
  `M`: `8 T D + 3 T M` values of the compute dtype and `1.5 H T^2`
  float32 attention values; on JAX, whose XLA CPU step keeps more, 1.15
  times the first and `4 H T^2`, on torch 1.1 times the first. The
  attention arrays count for `attention="dot_product"` too (torch's
  default): PyTorch's `scaled_dot_product_attention` kept less than that
  on the CPU at 577 tokens, as much for ViT-L/16 at 197. With LayerScale
  (`layer_scale_init`, DINOv2, DeiT-III) `0.5 T D` more, on torch `7 T D`
  (each scale keeps its branch's output for the gradient of its `gamma`:
  autograd saves `2 T D` more per block on torch; the peak measured:
  ViT-S/14 at 224 px, 257 tokens, 12 blocks, +1.8 MB an image on
  TensorFlow, +1.7 on JAX, +36 on torch). Register and distillation
  tokens are among the `T` tokens. With the SwiGLU MLP (`mlp="swiglu"`,
  DINOv2's ViT-g/14) `6 T M` instead of `3 T M`: the packed projection's
  `2 T M`, its two halves, the sigmoid, the gated products and the
  dropout's; ViT-S/14 at 224 px kept 51.6 MB an image more with it than
  with the GELU MLP on TensorFlow, 2.7 `T M` a block (measured on
  TensorFlow only; the backends' factors apply). With rotary embeddings
  (`rope`, DINOv3, EVA-02) `1.5 T D` more (the rotated queries and keys
  and their partners: ViT-S/16 at 224 px kept 4.9 MB an image more with
  them, 1.35 `T D` a block); with EVA-02's MLP norm (`mlp_norm`) `2 T M`
  more (its input and normalised values: EVA-02-S/16's options on ViT-S/16
  kept 173.5 MB an image against 142 estimated without; both measured on
  TensorFlow, `benchmarks/train_memory.py`);
- the attention-pooling head (`classifier="map"`, SigLIP) over `T` tokens:
  its keys and values, `2 T D` values of the compute dtype, and `1.5 H T`
  float32 attention values (the factors of the blocks on JAX and torch);
- a `MixerBlock` of `S` patches, `C` channels and MLP widths `Dt`, `Dc`:
  `8 S C + 3 (C Dt + S Dc)` values;
- a rematerialised block (`remat=True`) on TensorFlow: its input, plus one
  block's activations while it is recomputed. On JAX's and torch's CPU
  backends remat saved little or nothing (ViT-L/16, batch 8:
  `docs/performance/remat_vit_l16.json`), so a block counts in full there;
- every other layer: 4 values per output value (a convolution keeps its
  input, the normalisation and the activation theirs): the `pre_norm`
  LayerNorm (CLIP) of `T D` values counts `4 T D`.

The coefficients were fitted to the peak resident memory of `train` on
the CPU on each backend, by batch (`python benchmarks/train_memory.py`,
`docs/performance/train_memory.md`, which also compares the estimate with
the ViT-L/16 steps of `benchmarks/remat.py` on each backend).
"""

import dataclasses
import math

import keras

from keras_vit.layers.fused import accelerator
from keras_vit.layers.mixer import MixerBlock
from keras_vit.layers.pooling import AttentionPooling
from keras_vit.layers.resnet import ResNetRoot
from keras_vit.layers.rotary import RotaryEmbedding
from keras_vit.layers.transformer import TransformerBlock

# Values kept per image for the backward pass (see the module docstring).
TOKEN_WIDTH = 8           # x T D, per TransformerBlock (S C per MixerBlock)
MLP_WIDTH = 3             # x T M (C Dt + S Dc)
MLP_WIDTH_SWIGLU = 6      # x T M, per TransformerBlock(mlp="swiglu")
ATTENTION = 1.5           # x H T^2, float32
LAYER_SCALE = 0.5         # x T D, per TransformerBlock with LayerScale
LAYER_SCALE_TORCH = 7.0   # (torch: ViT-S/14 at 224 px, 168 MB an image measured, 132 without)
ROPE = 1.5                # x T D, per TransformerBlock with rotary embeddings
MLP_NORM = 2              # x T M, per TransformerBlock with an MLP norm (EVA-02)
POOLING_KEYS_VALUES = 2   # x T D, per AttentionPooling (and ATTENTION x H T)
# JAX (XLA on the CPU) keeps more: 4 attention arrays per head, and 15% more
# of the others (fitted to ViT-Ti/16 at 384 px and S/16 at 224); torch 10%
# more of the others (ViT-S/16 at 224: 105.7 MB an image, 90 on TensorFlow).
ATTENTION_JAX, ACTIVATIONS_JAX = 4.0, 1.15
ACTIVATIONS_TORCH = 1.1
OTHER_LAYER = 4           # x each other layer's output values
# The runtime's own memory during a step (the compiled step, tf.data's
# buffers, Keras' metrics, oneDNN's scratch space) beyond the gradients and
# optimizer slots: measured 0.24-0.49 GB for ViT-Ti/16, S/16 and Mixer-S/16,
# 1.18 GB for the R26+ViT-S/32 hybrid (its ResNet's convolutions).
RUNTIME_BYTES = 512 * 2**20
RUNTIME_BYTES_RESNET = 1280 * 2**20
# Batches of input the pipeline may hold at once (prefetch and the step's).
INPUT_BATCHES = 3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """A training step's host memory, in bytes: `fixed` (gradients,
    optimizer slots and the runtime) plus `per_image` times the batch on
    this host."""

    fixed: int
    per_image: int
    batch_size: int           # the images of one step on this host

    @property
    def total(self):
        return self.fixed + self.per_image * self.batch_size

    def largest_batch(self, available):
        """The largest batch on this host whose step fits in `available`
        bytes (0 when not even one image does)."""
        return max(0, int((available - self.fixed) // self.per_image))


def itemsize(dtype):
    """Bytes per element: "float32" 4, "bfloat16" 2, "bool" 1."""
    bits = "".join(c for c in keras.backend.standardize_dtype(dtype) if c.isdigit())
    return int(bits) // 8 if bits else 1


def _functional(model):
    """Whether `model`'s layers have symbolic inputs and outputs (a
    functional or Sequential model; a subclassed one has no `inputs`)."""
    return isinstance(model, keras.Model) and bool(getattr(model, "inputs", None))


def _layers(model):
    """The layers of a functional model, those of nested functional models
    included (their inner layers' outputs are symbolic too)."""
    for layer in model.layers:
        if _functional(layer):
            yield from _layers(layer)
        else:
            yield layer


def _symbolic(layer):
    """The symbolic tensors `layer` takes and gives (none for an unused layer)."""
    try:
        return keras.tree.flatten(layer.input) + keras.tree.flatten(layer.output)
    except (AttributeError, ValueError):
        return []


def _resolved(model, input_shape):
    """`{id(tensor): shape}` of every symbolic tensor of `model`'s layers
    (those of nested functional models included) for an input of
    `input_shape`, computed symbolically: no pixels are run."""
    tensors = {id(t): t for t in keras.tree.flatten(model.inputs)}
    for layer in model.layers:
        tensors.update((id(t), t) for t in _symbolic(layer))
    keys = list(tensors)
    probe = keras.Model(model.inputs, [tensors[key] for key in keys])
    specs = probe.compute_output_spec(keras.KerasTensor(input_shape))
    shapes = {key: tuple(spec.shape) for key, spec in zip(keys, specs, strict=True)}
    for layer in model.layers:
        if _functional(layer):
            shapes.update(_resolved(layer, shapes[id(keras.tree.flatten(layer.input)[0])]))
    return shapes


def _shapes_at(model, image_size):
    """The shapes of `model`'s symbolic tensors at `image_size` (an int or
    `(height, width)`) for a model built for any size (`input_shape=(None,
    None, 3)`: its graph's token and pixel counts are None), else {}."""
    inputs = keras.tree.flatten(model.inputs)
    if image_size is None or len(inputs) != 1:
        return {}
    shape = inputs[0].shape
    if len(shape) != 4 or None not in shape[1:3]:
        return {}
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    return _resolved(model, (1, height, width, shape[3]))


def _block_values(layer, itemsize, shape_of):
    """Bytes per image a block keeps for the backward pass, or None for a
    layer that is no block (`shape_of`: a symbolic tensor's shape)."""
    inputs = layer.input
    if isinstance(layer, TransformerBlock) and isinstance(inputs, (list, tuple)):
        inputs = inputs[0]  # a RoPE block's: its tokens and the rotary embedding
    shape = shape_of(inputs)
    activations, attention = _backend_factors()
    if isinstance(layer, TransformerBlock):
        tokens, width = shape[-2], shape[-1]
        token_width = (TOKEN_WIDTH + (layer_scale_values() if layer.ls1 is not None else 0)
                       + (ROPE if layer.rope is not None else 0))
        mlp_width = ((MLP_WIDTH_SWIGLU if layer.mlp == "swiglu" else MLP_WIDTH)
                     + (MLP_NORM if layer.mlp_norm else 0))
        kept = (activations * itemsize * (token_width * tokens * width
                                          + mlp_width * tokens * layer.mlp_dim)
                + 4 * attention * layer.num_heads * tokens * tokens)
        return kept, itemsize * tokens * width
    if isinstance(layer, AttentionPooling):
        tokens, width = shape[-2], shape[-1]
        kept = (activations * itemsize * POOLING_KEYS_VALUES * tokens * width
                + 4 * attention * layer.num_heads * tokens
                + OTHER_LAYER * itemsize * width)  # and its output, as any layer's
        return kept, 0  # (never rematerialised)
    if isinstance(layer, MixerBlock):
        patches, channels = shape[-2], shape[-1]
        kept = activations * itemsize * (TOKEN_WIDTH * patches * channels + MLP_WIDTH * (
            channels * layer.tokens_mlp_dim + patches * layer.channels_mlp_dim))
        return kept, itemsize * patches * channels
    return None


def estimate_training_memory(model, batch_size, *, optimizer_slots=2,
                             weight_copies=0, image_size=None):
    """The host memory one training step of `model` takes, or None where
    it cannot be counted (a subclassed model, whose layers have no
    symbolic outputs).

    Args:
        model: a built functional Keras model (any keras_vit model).
        batch_size: the images of one step on this host.
        optimizer_slots: variables the optimizer keeps per weight (SGD
            with momentum 1, AdamW 2).
        weight_copies: more copies of the weights (gradient accumulators,
            an EMA, SAM's perturbation).
        image_size: the training size (an int or `(height, width)`) of a
            model built for any size (`input_shape=(None, None, 3)`),
            whose layers' shapes are then counted at it; ignored for a
            model of one size.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViTTi16(weights=None, input_shape=(384, 384, 3), classes=10)
    >>> estimate = estimate_training_memory(model, 108, optimizer_slots=1)
    >>> round(estimate.total / 1e9, 1)
    22.5
    """
    if not _functional(model):
        return None
    per_image, largest_block, runtime = 0.0, 0.0, RUNTIME_BYTES
    remat_saves = remat_saves_memory()
    shapes = _shapes_at(model, image_size)

    def shape_of(tensor):
        return shapes.get(id(tensor), tensor.shape)

    for layer in _layers(model):
        if isinstance(layer, ResNetRoot):
            runtime = RUNTIME_BYTES_RESNET
        if isinstance(layer, RotaryEmbedding):
            continue  # one table for the batch, nothing to differentiate
        try:
            size = itemsize(layer.compute_dtype)
            counted = _block_values(layer, size, shape_of)
            if counted is None:
                outputs = keras.tree.flatten(layer.output)
                per_image += OTHER_LAYER * size * sum(
                    math.prod(shape_of(t)[1:]) for t in outputs)
                continue
        except (AttributeError, ValueError, TypeError):  # an unused or shared layer
            continue
        kept, block_input = counted
        if remat_saves and getattr(layer, "remat", False):
            per_image += block_input
            largest_block = max(largest_block, kept)
        else:
            per_image += kept
    per_image += largest_block
    inputs = keras.tree.flatten(model.inputs)
    per_image += INPUT_BATCHES * 4 * sum(math.prod(shape_of(t)[1:]) for t in inputs)
    weights = sum(math.prod(v.shape) * itemsize(v.dtype) for v in model.trainable_weights)
    fixed = runtime + weights * (1 + optimizer_slots + weight_copies)
    return MemoryEstimate(int(fixed), int(per_image), int(batch_size))


def _backend_factors():
    """`(activations, attention)`: the factor on a block's activations and
    the `(tokens, tokens)` float32 attention arrays it keeps per head: 1
    and 1.5 on TensorFlow, 1.1 and 1.5 on torch, 1.15 and 4 on JAX
    (ViT-Ti/16 at 384 px, 577 tokens: 326 MB per image measured on JAX,
    183 on TensorFlow, 152 on torch; ViT-S/16 at 224: 135, 90 and 106)."""
    backend = keras.backend.backend()
    if backend == "jax":
        return ACTIVATIONS_JAX, ATTENTION_JAX
    return (ACTIVATIONS_TORCH if backend == "torch" else 1.0), ATTENTION


def layer_scale_values():
    """Values x `T D` a block's LayerScale keeps more (see the module
    docstring): 7 on torch, 0.5 on TensorFlow and JAX."""
    return LAYER_SCALE_TORCH if keras.backend.backend() == "torch" else LAYER_SCALE


def remat_saves_memory():
    """Whether `remat=True` lowers a CPU training step's memory on this
    backend: on TensorFlow it did (ViT-L/16 at batch 8: 6.0 GB instead of
    9.3), on JAX (9.7 and 9.8 GB) and torch (9.3 and 10.1 GB) little."""
    return keras.backend.backend() == "tensorflow"


def available_memory():
    """Bytes this process can still take: the kernel's `MemAvailable`, or
    less under a cgroup memory limit (a container's); None where neither
    can be read (not Linux)."""
    bounds = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    bounds.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" or a huge v1 default: none
            bounds.append(max(0, int(limit) - usage))
        break
    return min(bounds) if bounds else None


_ANYWAY = "--no-memory-check trains anyway"


def _gb(n):
    return f"{n / 1e9:,.1f} GB"


def check_host_memory(model, batch_size, *, image_size, name, optimizer_slots,
                      weight_copies=0, gradient_accumulation_steps=None,
                      can_remat=False, available=None):
    """The estimate (`MemoryEstimate`), or a ValueError when the step does
    not fit in the memory still available: on the CPU the OOM killer would
    otherwise end the run mid-step without a word. None where nothing is
    checked: the model computes on an accelerator (whose runtime raises its
    own out-of-memory error), or the model or the memory cannot be counted.

    `batch_size` is the batch on this host; `can_remat`: the advice may
    name `--remat`; `available` (bytes) defaults to `available_memory()`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViTTi16(weights=None, input_shape=(384, 384, 3), classes=10)
    >>> check_host_memory(model, 512, image_size=384, name="ViTTi16", optimizer_slots=1,
    ...     can_remat=True, available=18_200_000_000)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ValueError: A training step of ViTTi16 at 384 px with batches of 512 images
    needs about 104.5 GB of memory (estimated), and 18.2 GB is available; pass
    --batch-size 86 or less, --batch-size 64 --gradient-accumulation-steps 8 (the
    same 512 images per update), or --remat (--no-memory-check trains anyway).
    """
    if accelerator() != "cpu":
        return None
    estimate = estimate_training_memory(model, batch_size, optimizer_slots=optimizer_slots,
                                        weight_copies=weight_copies, image_size=image_size)
    available = available_memory() if available is None else available
    if estimate is None or available is None or estimate.total <= available:
        return estimate
    fits = estimate.largest_batch(available)
    what = (f"A training step of {name} at {image_size} px with batches of {batch_size} "
            f"images needs about {_gb(estimate.total)} of memory (estimated), and "
            f"{_gb(available)} is available")
    if not fits:
        raise ValueError(f"{what}; not even one image fits: use a smaller --image-size"
                         f"{', --remat' if can_remat else ''} or a machine with more memory "
                         f"({_ANYWAY}).")
    advice = [f"--batch-size {fits} or less"]
    # The same images per update in smaller batches: a divisor of the batch.
    split = next(n for n in range(-(-batch_size // fits), batch_size + 1)
                 if batch_size % n == 0)
    accumulated = split * (gradient_accumulation_steps or 1)
    advice.append(f"--batch-size {batch_size // split} --gradient-accumulation-steps "
                  f"{accumulated} (the same {batch_size * (gradient_accumulation_steps or 1)} "
                  "images per update)")
    if can_remat:
        advice.append("--remat")
    listed = ", ".join(advice[:-1]) + ", or " + advice[-1]
    raise ValueError(f"{what}; pass {listed} ({_ANYWAY}).")


def host_share(strategy=None):
    """The fraction of the global batch this process computes: its local
    devices over all replicas (1 in a single process)."""
    if strategy is not None:
        try:
            local = len(strategy.extended.worker_devices or ())
        except (RuntimeError, AttributeError):
            local = 0
        replicas = strategy.num_replicas_in_sync
        return local / replicas if local and replicas else 1.0
    if keras.backend.backend() == "jax":
        import jax

        return jax.local_device_count() / jax.device_count()
    return 1.0


__all__ = ["MemoryEstimate", "available_memory", "check_host_memory",
           "estimate_training_memory", "host_share", "itemsize"]
