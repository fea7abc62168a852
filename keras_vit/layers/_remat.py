"""Rematerialised block calls (gradient checkpointing) whose recomputation
draws the same random masks as the forward pass.

`keras.remat(f)` keeps none of `f`'s intermediate activations: the backward
pass runs `f` again (`tf.recompute_grad`, `jax.checkpoint`,
`torch.utils.checkpoint`). A Keras dropout layer draws its mask from its
`SeedGenerator`, whose state advances at each draw, so on TensorFlow and
torch the recomputation would draw other masks than the forward pass and
the gradients would belong to another network (measured: gradients of two
blocks with dropout 0.3 off by up to 180, of at most 210). Here each random
layer's seed state is read before the call, passed in as an argument, and
set again at the start of every run of `f`: the recomputation draws the
forward's masks, and the state ends where the plain call leaves it. (On
torch a `Dropout` without a seed draws from torch's global generator, which
`torch.utils.checkpoint` restores for the recomputation itself.)

(`keras.RematScope` is not used: on JAX it traces the block's Python
`training` flag as an array, and it has the same mask problem.)
"""

import keras
from keras import ops


def rematerialized_call(forward, inputs, random_layers):
    """`forward(inputs)` under `keras.remat`, the seed states of the
    `random_layers` that draw (dropout, drop path with a rate above 0)
    restored at the start of each run.

    Example (in a block's `call`):

    >>> rematerialized_call(lambda x: self._forward(x, training), inputs,  # a line of a method
    ...                     [self.dropout, self.drop_path])  # doctest: +SKIP
    """
    generators = [layer.seed_generator for layer in random_layers
                  if getattr(layer, "rate", 0) > 0
                  and getattr(layer, "seed_generator", None) is not None]
    states = [ops.copy(generator.state.value) for generator in generators]

    def run(x, *seed_states):
        for generator, state in zip(generators, seed_states, strict=True):
            generator.state.assign(state)
        return forward(x), *(generator.state.value for generator in generators)

    outputs, *states = keras.remat(run)(inputs, *states)
    # The states the draws left, set outside `run`: on JAX a value set
    # inside it belongs to the checkpoint's trace and must not escape it.
    for generator, state in zip(generators, states, strict=True):
        generator.state.assign(state)
    return outputs
