"""The ResNet (BiT) stem of the R+ViT hybrids: weight-standardised
convolutions, GroupNorm, bottleneck units (ViT paper, Sec. 3.1 "Hybrid
Architecture"; Kolesnikov et al., "Big Transfer")."""

import keras
from keras import ops

from keras_vit import _checks
from keras_vit.layers._utils import checked_channels

GROUPS = 32
GROUP_NORM_EPSILON = 1e-6
WEIGHT_STANDARDIZATION_EPSILON = 1e-5
STANDARDIZATIONS = ("std", "variance")
# The stem's arithmetic per source: (standardization, its epsilon, GroupNorm
# epsilon). Official `StdConv`: (w - mean) / (std + 1e-5), flax GroupNorm
# 1e-6. timm's hybrids (`StdConv2dSame(eps=1e-8)`, a batch_norm over the
# kernel): (w - mean) / sqrt(var + 1e-8), `nn.GroupNorm` 1e-5.
# The stem is channels-last whatever `keras.config.image_data_format()`
# says (the models take (batch, height, width, 3) images): each conv and
# pool is given this explicitly, as the GroupNorms' axis is -1.
DATA_FORMAT = "channels_last"
RESNET_ARITHMETIC = {
    "official": ("std", WEIGHT_STANDARDIZATION_EPSILON, GROUP_NORM_EPSILON),
    "timm": ("variance", 1e-8, 1e-5),
}


def resnet_arithmetic(name):
    """`{"standardization", "standardization_epsilon",
    "group_norm_epsilon"}` of a named stem arithmetic ("official",
    "timm"), as `ResNetRoot` / `BottleneckUnit` keyword arguments."""
    if name not in RESNET_ARITHMETIC:
        raise ValueError(
            f"Unknown resnet arithmetic {name!r}; allowed: {tuple(RESNET_ARITHMETIC)}."
        )
    mode, ws_eps, gn_eps = RESNET_ARITHMETIC[name]
    return {"standardization": mode, "standardization_epsilon": ws_eps,
            "group_norm_epsilon": gn_eps}


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """`Conv2D` with weight standardisation.

    The kernel is standardised over `(height, width, in_channels)` before
    every convolution: `w = (w - mean(w)) / (std(w) + eps)` with the
    population standard deviation and `eps = 1e-5`, as the official
    `StdConv`; with `standardization="variance"`,
    `w = (w - mean(w)) / sqrt(var(w) + eps)`, as timm's `StdConv2dSame`
    (whose hybrids use `eps=1e-8`). Takes every `keras.layers.Conv2D`
    argument.

    Example:

    >>> conv = StdConv2D(8, 3, padding="same", use_bias=False)
    >>> tuple(conv(keras.ops.ones((1, 6, 6, 4))).shape)
    (1, 6, 6, 8)
    """

    def __init__(self, *args, epsilon=WEIGHT_STANDARDIZATION_EPSILON,
                 standardization="std", **kwargs):
        super().__init__(*args, **kwargs)
        self.epsilon = float(epsilon)
        if standardization not in STANDARDIZATIONS:
            raise ValueError(
                f"Unknown standardization={standardization!r}; allowed: "
                f"{STANDARDIZATIONS}."
            )
        self.standardization = standardization

    def standardized_kernel(self, kernel):
        """`kernel` standardised over `(height, width, in_channels)` (computed
        in float32, returned in the kernel's dtype): what every convolution
        uses."""
        w = ops.cast(kernel, "float32")
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)
        w = w - mean
        variance = ops.mean(ops.square(w), axis=(0, 1, 2), keepdims=True)
        if self.standardization == "variance":
            return ops.cast(w / ops.sqrt(variance + self.epsilon), kernel.dtype)
        return ops.cast(w / (ops.sqrt(variance) + self.epsilon), kernel.dtype)

    def convolution_op(self, inputs, kernel):
        """`Conv2D`'s convolution with the standardised kernel."""
        return super().convolution_op(inputs, self.standardized_kernel(kernel))

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        config["standardization"] = self.standardization
        return config


def _group_norm(name, policy, gamma_initializer="ones", epsilon=GROUP_NORM_EPSILON):
    return keras.layers.GroupNormalization(
        groups=GROUPS,
        axis=-1,
        epsilon=epsilon,
        gamma_initializer=gamma_initializer,
        dtype=policy,
        name=name,
    )


def _std(layer):
    return {"standardization": layer.standardization,
            "epsilon": layer.standardization_epsilon}


def _arithmetic_config(layer):
    return {"standardization": layer.standardization,
            "standardization_epsilon": layer.standardization_epsilon,
            "group_norm_epsilon": layer.group_norm_epsilon}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetRoot(keras.layers.Layer):
    """The root of the hybrid stem: 7x7/2 StdConv, GroupNorm, ReLU,
    3x3/2 max-pool (output stride 4).

    Args:
        width: number of channels (64 times the width factor).
        standardization, standardization_epsilon: the `StdConv2D`
            arithmetic (official: "std", 1e-5; timm: "variance", 1e-8).
        group_norm_epsilon: GroupNorm epsilon (official 1e-6, timm 1e-5).

    Example:

    >>> tuple(ResNetRoot(64)(keras.ops.ones((1, 32, 32, 3))).shape)
    (1, 8, 8, 64)
    """

    def __init__(self, width=64, standardization="std",
                 standardization_epsilon=WEIGHT_STANDARDIZATION_EPSILON,
                 group_norm_epsilon=GROUP_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.width = _checks.positive_int(width, "width")
        self.standardization = standardization
        self.standardization_epsilon = float(standardization_epsilon)
        self.group_norm_epsilon = float(group_norm_epsilon)
        if self.width % GROUPS:
            raise ValueError(
                f"ResNetRoot width must be a multiple of {GROUPS} (GroupNorm "
                f"groups), got {width}."
            )
        policy = self.dtype_policy
        self.conv_root = StdConv2D(
            self.width, 7, strides=2, padding="same", use_bias=False,
            data_format=DATA_FORMAT, dtype=policy, name="conv_root", **_std(self),
        )
        self.gn_root = _group_norm("gn_root", policy, epsilon=self.group_norm_epsilon)
        self.pool = keras.layers.MaxPooling2D(
            3, strides=2, padding="same", data_format=DATA_FORMAT, dtype=policy,
            name="pool",
        )

    def build(self, input_shape):
        """Builds the stem's convolution and GroupNorm for `input_shape` and
        records the channel count images must have."""
        self._channels = input_shape[-1]
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        self.built = True

    def call(self, inputs):
        """The stem: standardised 7x7/2 convolution, GroupNorm, ReLU, 3x3/2 max
        pooling."""
        inputs = checked_channels(inputs, getattr(self, "_channels", None))
        x = ops.relu(self.gn_root(self.conv_root(inputs)))
        return self.pool(x)

    def compute_output_shape(self, input_shape):
        """The input shape after the stride-2 convolution and pooling, with
        `width` channels."""
        shape = self.conv_root.compute_output_shape(input_shape)
        return self.pool.compute_output_shape(shape)

    def get_config(self):
        config = super().get_config()
        config["width"] = self.width
        config.update(_arithmetic_config(self))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """Pre-activation-free bottleneck unit of the BiT ResNet (official
    `ResidualUnit`): 1x1 -> 3x3 (strided) -> 1x1 (4x features), each a
    weight-standardised conv followed by GroupNorm; a projection shortcut
    when the shape changes. The last GroupNorm starts with zero scale.

    Args:
        features: bottleneck width; the output has `4 * features` channels.
        strides: stride of the 3x3 conv and of the projection.
        standardization, standardization_epsilon, group_norm_epsilon: as
            in `ResNetRoot`.

    Example:

    >>> tuple(BottleneckUnit(32, strides=2)(keras.ops.ones((1, 8, 8, 64))).shape)
    (1, 4, 4, 128)
    """

    def __init__(self, features, strides=1, standardization="std",
                 standardization_epsilon=WEIGHT_STANDARDIZATION_EPSILON,
                 group_norm_epsilon=GROUP_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.features = _checks.positive_int(features, "features")
        self.strides = _checks.positive_int_pair(strides, "strides")
        self.standardization = standardization
        self.standardization_epsilon = float(standardization_epsilon)
        self.group_norm_epsilon = float(group_norm_epsilon)
        std, gn_eps = _std(self), self.group_norm_epsilon
        policy = self.dtype_policy
        f = self.features
        self.conv1 = StdConv2D(f, 1, use_bias=False, data_format=DATA_FORMAT, dtype=policy,
                               name="conv1", **std)
        self.gn1 = _group_norm("gn1", policy, epsilon=gn_eps)
        self.conv2 = StdConv2D(
            f, 3, strides=self.strides, padding="same", use_bias=False,
            data_format=DATA_FORMAT, dtype=policy, name="conv2", **std,
        )
        self.gn2 = _group_norm("gn2", policy, epsilon=gn_eps)
        self.conv3 = StdConv2D(4 * f, 1, use_bias=False, data_format=DATA_FORMAT,
                               dtype=policy, name="conv3", **std)
        self.gn3 = _group_norm("gn3", policy, gamma_initializer="zeros", epsilon=gn_eps)
        self.conv_proj = None
        self.gn_proj = None

    @property
    def has_projection(self):
        """Whether the residual goes through a 1x1 projection (built when the
        input's channels are not `4 * features` or `strides` is not 1)."""
        return self.conv_proj is not None

    def build(self, input_shape):
        """Builds the three convolutions and GroupNorms, and the projection of
        the residual when the input's channels or the strides need it."""
        f = self.features
        policy = self.dtype_policy
        if input_shape[-1] != 4 * f or self.strides != (1, 1):
            self.conv_proj = StdConv2D(
                4 * f, 1, strides=self.strides, use_bias=False, data_format=DATA_FORMAT,
                dtype=policy, name="conv_proj", **_std(self),
            )
            self.gn_proj = _group_norm("gn_proj", policy, epsilon=self.group_norm_epsilon)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in (
            (self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)
        ):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)
        self.built = True

    def call(self, inputs):
        """`relu(residual + gn3(conv3(relu(gn2(conv2(relu(gn1(conv1(x)))))))))`,
        the residual projected when `has_projection`."""
        residual = inputs
        if self.conv_proj is not None:
            residual = self.gn_proj(self.conv_proj(inputs))
        y = ops.relu(self.gn1(self.conv1(inputs)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        """The input shape after `strides`, with `4 * features` channels."""
        shape = self.conv2.compute_output_shape(
            tuple(input_shape[:-1]) + (self.features,)
        )
        return tuple(shape[:-1]) + (4 * self.features,)

    def get_config(self):
        config = super().get_config()
        config.update({"features": self.features, "strides": self.strides})
        config.update(_arithmetic_config(self))
        return config
