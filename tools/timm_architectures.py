"""Writes `keras_vit/weights/timm_architectures.py`: for every ViT and DeiT
architecture timm registers, what its weights do not show and keras_vit
must compute the same way (the MLP and its activation, the LayerNorm
epsilon, the pooling, the attention heads), or why keras_vit does not build
it.

timm's Hub repositories and `save_for_hf` folders record the architecture
name, not these arguments (they live in each name's entry point, e.g.
`vit_base_patch16_siglip_224` computes erf GELU and `_256` tanh GELU), so
the reader looks the name up here. Each architecture is built once with
one block, by timm itself, and its modules are read:

    python tools/timm_architectures.py      # needs timm (tests/torch_libraries.py)

`tests/test_family_checkpoints.py` rebuilds a sample with the installed
timm and checks the rows.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "keras_vit", "weights", "timm_architectures.py")


def _is_packed_swiglu(mlp):
    """timm's `SwiGLUPacked`: a `GluMlp` of Linear layers with SiLU on the
    first half (`gate_last=False`) and no norm inside, which
    `TransformerBlock(mlp="swiglu")` computes."""
    import torch

    return (type(mlp).__name__ == "GluMlp" and isinstance(mlp.fc1, torch.nn.Linear)
            and not mlp.gate_last and isinstance(mlp.norm, torch.nn.Identity)
            and type(mlp.act).__name__ == "SiLU")


def _mlp(mlp, why):
    """`(kind, gelu)`: "gelu" and its form, or "swiglu" and None; a reason
    appended to `why` for an MLP keras_vit does not build."""
    import torch

    if _is_packed_swiglu(mlp):
        kind, gelu = "swiglu", None
    else:
        kind = "gelu"
        if mlp is None or type(mlp).__name__ != "Mlp":
            why.append(f"a {type(mlp).__name__} MLP")
        act = type(getattr(mlp, "act", None)).__name__
        gelu = {"GELU": "erf", "GELUTanh": "tanh", "QuickGELU": "quick"}.get(act)
        if act == "GELU" and getattr(mlp.act, "approximate", "none") == "tanh":
            gelu = "tanh"
        if gelu is None:
            why.append(f"{act} activation")
    if not isinstance(getattr(mlp, "norm", None) or torch.nn.Identity(), torch.nn.Identity):
        why.append("a normalisation inside the MLP")
    if hasattr(mlp, "fc1") and any(getattr(getattr(mlp, fc, None), "bias", None) is None
                                   for fc in ("fc1", "fc2")):
        why.append("an MLP without biases")
    return kind, gelu


def describe(model):
    """`(row, None)` or `(None, why keras_vit does not build it)`."""
    import torch
    from timm.layers import LayerNorm as TimmLayerNorm
    from timm.models.vision_transformer import Block

    block = model.blocks[0]
    why = []
    if type(block) is not Block:
        why.append(f"{type(block).__name__} blocks")
    norm = getattr(block, "norm1", None)
    if not isinstance(norm, (torch.nn.LayerNorm, TimmLayerNorm)):
        why.append(f"{type(norm).__name__} normalisation")
    mlp, gelu = _mlp(getattr(block, "mlp", None), why)
    attn = getattr(block, "attn", None)
    if getattr(attn, "qkv", None) is None or getattr(attn.qkv, "bias", None) is None:
        why.append("attention without a query-key-value bias")
    if not isinstance(getattr(attn, "q_norm", torch.nn.Identity()), torch.nn.Identity):
        why.append("query-key normalisation")
    if not isinstance(getattr(attn, "norm", torch.nn.Identity()), torch.nn.Identity):
        why.append("a normalisation inside the attention")
    if getattr(model, "pos_embed", None) is None:
        why.append("no learned position embedding (rotary embeddings)")
    if not isinstance(getattr(model, "norm", None), (torch.nn.LayerNorm, TimmLayerNorm)):
        why.append("no final LayerNorm")
    if getattr(model.patch_embed, "norm", None) is not None and \
            not isinstance(model.patch_embed.norm, torch.nn.Identity):
        why.append("a normalised patch embedding")
    pool = getattr(model, "global_pool", "token")
    if why:
        return None, ", ".join(dict.fromkeys(why))
    ls = getattr(block, "ls1", None)
    init = float(ls.gamma.detach()[0]) if hasattr(ls, "gamma") else None
    return dict(
        mlp=mlp, gelu=gelu, num_heads=int(attn.num_heads), eps=float(norm.eps), pool=pool,
        class_token=getattr(model, "cls_token", None) is not None,
        reg_tokens=int(getattr(model, "num_reg_tokens", 0) or 0),
        no_embed_class=bool(getattr(model, "no_embed_class", False)),
        pre_norm=not isinstance(getattr(model, "norm_pre", torch.nn.Identity()),
                                torch.nn.Identity),
        layer_scale=None if init is None else round(init, 12),
        fc_norm=not isinstance(getattr(model, "fc_norm", torch.nn.Identity()),
                               torch.nn.Identity),
        patch_bias=getattr(getattr(model.patch_embed, "proj", None), "bias", None) is not None,
        distilled=getattr(model, "dist_token", None) is not None,
    ), None


def rows(timm, names):
    out, refused = {}, {}
    for name in names:
        try:
            model = timm.create_model(name, pretrained=False, depth=1)
        except Exception as error:  # noqa: BLE001  recorded, the table goes on
            refused[name] = f"not built by timm here ({type(error).__name__})"
            continue
        try:
            row, why = describe(model)
        except AttributeError as error:  # a module layout this table does not know
            row, why = None, f"a layout keras_vit does not read ({error})"
        if row is None:
            refused[name] = why
        else:
            out[name] = row
    return out, refused


def names(timm):
    return sorted(set(timm.list_models("vit_*")) | set(timm.list_models("deit*")))


def _one_per_line(table):
    lines = "".join(f"    {name!r}: {value!r},\n" for name, value in table.items())
    return "{\n" + lines + "}"


def main():
    import transformers  # noqa: F401  (before the stand-in: it reads torchvision's version)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from torch_libraries import import_timm

    timm = import_timm()
    start = time.perf_counter()
    built, refused = rows(timm, names(timm))
    text = ("# ruff: noqa: E501  (one architecture a line)\n"
            f'"""What timm {timm.__version__}\'s ViT and DeiT architectures compute that '
            "their weights do not show,\nby name (written by tools/timm_architectures.py; "
            "do not edit).\n\n`ARCHITECTURES`: name -> mlp ('gelu', 'swiglu'), gelu ('erf', "
            "'tanh', 'quick';\nNone with 'swiglu', whose activation is SiLU), num_heads, "
            "LayerNorm eps, pool\n('token', 'avg', 'map', ''), class_token, reg_tokens, "
            "no_embed_class, pre_norm,\nlayer_scale (the initial gamma, None: none), "
            "fc_norm, patch_bias, distilled.\n`REFUSED`: name -> what keras_vit does not "
            'build.\n"""\n\n'
            f"TIMM_VERSION = {timm.__version__!r}\n\n"
            f"ARCHITECTURES = {_one_per_line(built)}\n\n"
            f"REFUSED = {_one_per_line(refused)}\n")
    with open(OUT, "w") as file:
        file.write(text)
    print(f"{len(built)} architectures, {len(refused)} refused, "
          f"{time.perf_counter() - start:.0f} s -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
