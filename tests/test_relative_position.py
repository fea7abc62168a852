"""keras_vit.weights.relative_position: BEiT's relative-position-bias table
resized as timm (`resize_rel_pos_bias_table`, its checkpoint filter and
`set_input_size`) and transformers (`BeitRelativePositionBias.forward`)
resize it, compared with the libraries' own functions on a random table
within 1e-5 (float32): growing, shrinking, square and not; the index of
both libraries; the refusals."""

import numpy as np
import pytest

from keras_vit.layers.transformer import relative_position_index
from keras_vit.weights.relative_position import (
    relative_position_grid, resize_relative_position_bias_table, table_rows)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch_libraries import import_timm  # noqa: E402

timm = import_timm()
HEADS = 3
CASES = [((4, 4), (6, 5)), ((5, 5), (3, 3)), ((4, 4), (6, 6)), ((3, 3), (3, 7)), ((2, 2), (4, 4))]


def random_table(grid, seed=0):
    return np.random.default_rng(seed).normal(size=(table_rows(grid), HEADS)).astype("float32")


def timm_resized(table, old, new):
    """timm's own resize, as `Beit.set_input_size` calls it."""
    from timm.layers import resize_rel_pos_bias_table

    out = resize_rel_pos_bias_table(torch.from_numpy(table), new_window_size=new,
                                    new_bias_shape=(table_rows(new), HEADS), old_window_size=old)
    return out.numpy()


def transformers_bias(table, old, new):
    """transformers' bias `(heads, N+1, N+1)` for a `new` grid from a table
    stored for `old` (`BeitRelativePositionBias.forward`)."""
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    config = transformers.BeitConfig(num_attention_heads=HEADS, image_size=[16 * s for s in old],
                                     patch_size=16)
    module = BeitRelativePositionBias(config)
    with torch.no_grad():
        module.relative_position_bias_table.copy_(torch.from_numpy(table))
        return module(tuple(new))[0].numpy()


@pytest.mark.parametrize("old, new", CASES, ids=[f"{o}->{n}" for o, n in CASES])
def test_the_timm_resize_is_timms(old, new):
    table = random_table(old)
    got = resize_relative_position_bias_table(table, old, new)
    assert got.shape == (table_rows(new), HEADS) and got.dtype == np.float32
    np.testing.assert_allclose(got, timm_resized(table, old, new), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[-3:], table[-3:])  # the class rows kept


def test_timms_checkpoint_filter_resizes_the_same():
    """`beit.checkpoint_filter_fn` (loading at another `img_size`) infers a
    square source, as `old_grid=None` does."""
    from timm.layers import resize_rel_pos_bias_table

    table = random_table((4, 4))
    want = resize_rel_pos_bias_table(torch.from_numpy(table), new_window_size=(6, 5),
                                     new_bias_shape=(table_rows((6, 5)), HEADS)).numpy()
    got = resize_relative_position_bias_table(table, None, (6, 5))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


HF_CASES = CASES + [((3, 5), (4, 6)), ((5, 3), (5, 3))]


@pytest.mark.parametrize("old, new", HF_CASES, ids=[f"{o}->{n}" for o, n in HF_CASES])
def test_the_transformers_resize_is_transformers(old, new):
    """A non-square stored table (none is released) is read width first,
    as transformers reads it, so it is resampled even at its own grid."""
    table = random_table(old, seed=1)
    got = resize_relative_position_bias_table(table, old, new, method="transformers")
    bias = got[relative_position_index(new)].transpose(2, 0, 1)
    np.testing.assert_allclose(bias, transformers_bias(table, old, new), rtol=0, atol=1e-5)


def test_the_two_methods_differ_and_agree_at_the_stored_grid():
    table = random_table((4, 4))
    timm_way = resize_relative_position_bias_table(table, (4, 4), (6, 6))
    hf_way = resize_relative_position_bias_table(table, (4, 4), (6, 6), method="transformers")
    assert np.abs(timm_way - hf_way).max() > 1e-2
    for method in ("timm", "transformers"):
        assert resize_relative_position_bias_table(table, (4, 4), (4, 4), method) is table


def test_the_index_the_layers_use_is_both_libraries():
    """The bias of query i and key j is `table[index[i, j]]` in both."""
    from timm.models.beit import gen_relative_position_index
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    for grid in [(2, 2), (3, 5), (4, 4)]:
        ours = relative_position_index(grid)
        np.testing.assert_array_equal(ours, gen_relative_position_index(grid).numpy())
        np.testing.assert_array_equal(
            ours, BeitRelativePositionBias.generate_relative_position_index(grid).numpy())


def test_a_tables_square_grid():
    assert [relative_position_grid(table_rows((g, g))) for g in (1, 2, 14, 24)] == [
        (1, 1), (2, 2), (14, 14), (24, 24)]
    assert relative_position_grid(table_rows((3, 5))) is None
    assert relative_position_grid(2) is None


@pytest.mark.parametrize("call, message", [
    (lambda t: resize_relative_position_bias_table(t, (4, 4), (5, 5), method="scipy"),
     "Unknown method='scipy'; allowed: ('timm', 'transformers')."),
    (lambda t: resize_relative_position_bias_table(t, (4, 3), (5, 5)),
     "old_grid (4, 3) has a table of 38 rows, not 52."),
    (lambda t: resize_relative_position_bias_table(t, (4, 4), (0, 5)),
     "new_grid=(0, 5) is not a grid of patches; expected (rows, columns), two positive "
     "integers."),
    (lambda t: resize_relative_position_bias_table(t[:-1], None, (5, 5)),
     "A table of 51 rows is no square grid's (2g-1)^2 + 3 rows; pass old_grid."),
    (lambda t: resize_relative_position_bias_table(t[0], (4, 4), (5, 5)),
     "Expected a float table of shape (rows, heads), got float32 (3,)."),
])
def test_refusals_name_the_value(call, message):
    with pytest.raises(ValueError) as raised:
        call(random_table((4, 4)))
    assert str(raised.value) == message
