"""Writes `keras_vit/weights/timm_architectures.py`: for every ViT, DeiT,
EVA (`Eva`: EVA, EVA-02, DINOv3) and BEiT (`Beit`: BEiT, BEiT v2)
architecture timm registers, what its weights do not show and keras_vit
must compute the same way (the MLP and its activation, the LayerNorm
epsilon, the pooling, the attention heads; an Eva's rotary embedding,
attention biases and MLP norm; a BEiT's tables), or why keras_vit does
not build it.

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


def _eva_rope(model, attn, why):
    """The `VisionTransformer(rope=...)` dict of an Eva's rotary embedding
    (None: none); a reason appended to `why` for one keras_vit does not
    compute (`keras_vit.layers.rotary`)."""
    rope = getattr(model, "rope", None)
    if rope is None:
        return None
    kind, half = type(rope).__name__, bool(getattr(attn, "rotate_half", False))
    if kind == "RotaryEmbeddingDinoV3":
        same = (rope.min_period is None and rope.max_period is None
                and rope.normalize_coords == "separate" and rope.grid_offset == 0
                and rope.grid_indexing == "ij" and rope.rotate_half and half)
        if same:
            return {"variant": "dinov3", "temperature": float(rope.temperature)}
    elif kind == "RotaryEmbeddingCat":
        same = (not rope.in_pixels and rope.grid_type == "index" and rope.grid_offset == 0
                and rope.grid_indexing == "ij" and not rope.rotate_half and not half
                and not rope.linear_bands)
        if same:
            ref = rope.ref_feat_shape
            return {"variant": "eva", "temperature": float(rope.temperature),
                    "ref_grid": None if ref is None else tuple(int(r) for r in ref)}
    if kind == "RotaryEmbeddingMixed":
        why.append("learned mixed-axis rotary frequencies (rope_type='mixed')")
    elif kind in ("RotaryEmbeddingDinoV3", "RotaryEmbeddingCat"):
        grid = f"grid_indexing={rope.grid_indexing!r}, grid_offset={rope.grid_offset}"
        why.append(f"a {kind} of another layout than keras_vit's ({grid}, "
                   f"rotate_half={half})")
    else:
        why.append(f"a {kind} rotary embedding")
    return None


def _eva_attention(block, dim, why):
    """"qkv", "qv" or "none": the attention biases of an Eva block."""
    import torch

    attn = block.attn
    if type(attn).__name__ != "EvaAttention":
        why.append(f"{type(attn).__name__} attention")
        return None
    if not isinstance(attn.q_norm, torch.nn.Identity):
        why.append("query-key normalisation (qk_norm)")
    if not isinstance(attn.norm, torch.nn.Identity):
        why.append("a normalisation inside the attention (scale_attn_inner)")
    if attn.gate is not None:
        why.append("gated attention")
    if attn.head_dim * attn.num_heads != dim:
        why.append(f"attention heads of width {attn.head_dim} (attn_head_dim)")
    if attn.qkv is not None:
        return "qv" if attn.q_bias is not None else "none"
    return "qv" if attn.q_proj.bias is not None else "none"


def _eva_mlp(mlp, why):
    """`(kind, gelu, mlp_norm)` of an Eva block's MLP (timm's `Mlp`, the
    packed `GluMlp` or the split `SwiGLU`: `fc1_g`, `fc1_x`)."""
    import torch

    norm = not isinstance(getattr(mlp, "norm", torch.nn.Identity()), torch.nn.Identity)
    if type(mlp).__name__ == "SwiGLU":
        if type(mlp.act).__name__ != "SiLU":
            why.append(f"a SwiGLU gated by {type(mlp.act).__name__}")
        if any(fc.bias is None for fc in (mlp.fc1_g, mlp.fc1_x, mlp.fc2)):
            why.append("an MLP without biases")
        return "swiglu", None, norm
    if type(mlp).__name__ == "GluMlp":
        if not (isinstance(mlp.fc1, torch.nn.Linear) and not mlp.gate_last
                and type(mlp.act).__name__ == "SiLU"):
            why.append("a GluMlp that is not SwiGLU")
        return "swiglu", None, norm
    sub = []
    kind, gelu = _mlp(mlp if not norm else _without_norm(mlp), sub)
    why += sub
    return kind, gelu, norm


def _without_norm(mlp):
    """`mlp` seen without its inner LayerNorm (`_mlp` refuses one; an Eva's
    is keras_vit's `mlp_norm`)."""
    import copy

    import torch

    plain = copy.copy(mlp)
    plain.norm = torch.nn.Identity()
    return plain


def _eva_pool(model, why):
    """`(pool, fc_norm)`: the pooling and where the final LayerNorm is
    (before pooling: `norm`; after: `fc_norm`), as keras_vit builds them."""
    from timm.layers import LayerNorm as TimmLayerNorm
    import torch

    def layer_norm(module):
        return isinstance(module, (torch.nn.LayerNorm, TimmLayerNorm))

    norm, fc_norm = layer_norm(model.norm), layer_norm(model.fc_norm)
    pool = model.global_pool
    if pool not in ("avg", "token"):
        why.append(f"global_pool={pool!r}")
    if norm == fc_norm:
        why.append("a LayerNorm before and after the pooling" if norm else
                   "no final LayerNorm")
    elif fc_norm and pool == "token":
        why.append("a LayerNorm after the class token (fc_norm with global_pool='token')")
    return pool, fc_norm


def describe_eva(model):
    """`(row, None)` or `(None, why)` for timm's `Eva` (EVA, EVA-02,
    DINOv3, timm's RoPE ViTs): the ViT row and the options of the RoPE
    families, `rope` (`VisionTransformer(rope=...)`), `qkv_bias`,
    `mlp_norm` and `position_embedding`."""
    import torch
    from timm.layers import LayerNorm as TimmLayerNorm

    block, why = model.blocks[0], []
    if type(block).__name__ != "EvaBlock":
        why.append(f"{type(block).__name__} blocks (use_post_norm)")
        return None, ", ".join(why)
    if not isinstance(block.norm1, (torch.nn.LayerNorm, TimmLayerNorm)):
        why.append(f"{type(block.norm1).__name__} normalisation")
    dim = model.embed_dim
    qkv_bias = _eva_attention(block, dim, why)
    mlp, gelu, mlp_norm = _eva_mlp(block.mlp, why)
    if (block.gamma_1 is None) != (block.gamma_2 is None):
        why.append("layer scale on the attention branch only")
    rope = _eva_rope(model, block.attn, why)
    pool, fc_norm = _eva_pool(model, why)
    if not isinstance(model.norm_pre, torch.nn.Identity):
        why.append("a LayerNorm before the blocks (use_pre_transformer_norm)")
    if getattr(model.patch_embed, "dynamic_img_pad", False):
        why.append("images padded to a multiple of the patch (dynamic_img_pad)")
    if pool == "token" and model.cls_token is None:
        why.append("global_pool='token' without a class token")
    if why:
        return None, ", ".join(dict.fromkeys(why))
    init = None if block.gamma_1 is None else round(float(block.gamma_1.detach()[0]), 12)
    return dict(
        mlp=mlp, gelu=gelu, num_heads=int(block.attn.num_heads), eps=float(block.norm1.eps),
        pool=pool, class_token=model.cls_token is not None,
        reg_tokens=int(model.reg_token.shape[1]) if model.reg_token is not None else 0,
        no_embed_class=bool(model.no_embed_class), pre_norm=False, layer_scale=init,
        fc_norm=fc_norm, patch_bias=model.patch_embed.proj.bias is not None, distilled=False,
        rope=rope, qkv_bias=qkv_bias, mlp_norm=mlp_norm,
        position_embedding=model.pos_embed is not None,
    ), None


def describe_beit(model):
    """`(row, None)` or `(None, why)` for timm's `Beit` (`beit_*`,
    `beitv2_*`): the ViT row and BEiT's `qkv_bias` ('qv': `q_bias`,
    `v_bias`; 'none'), `mlp_norm` (`scale_mlp`), `position_embedding`
    (`use_abs_pos_emb`) and `relative_position_bias` (each block's table);
    no `rope` field (`keras_vit.weights.timm_beit`)."""
    import torch

    block, why = model.blocks[0], []
    if model.rel_pos_bias is not None:
        why.append("a relative position bias shared by all blocks")
    mlp, gelu, mlp_norm = _eva_mlp(block.mlp, why)
    if mlp != "gelu":
        why.append("a SwiGLU MLP")
    if model.global_pool not in ("avg", "token"):
        why.append(f"global_pool={model.global_pool!r}")
    if why:
        return None, ", ".join(dict.fromkeys(why))
    attn, gamma = block.attn, block.gamma_1
    return dict(
        mlp=mlp, gelu=gelu, num_heads=int(attn.num_heads), eps=float(block.norm1.eps),
        pool=model.global_pool, class_token=True, reg_tokens=0, no_embed_class=False,
        pre_norm=False,
        layer_scale=None if gamma is None else round(float(gamma.detach()[0]), 12),
        fc_norm=not isinstance(model.fc_norm, torch.nn.Identity),
        patch_bias=model.patch_embed.proj.bias is not None, distilled=False,
        qkv_bias="qv" if attn.q_bias is not None else "none", mlp_norm=mlp_norm,
        position_embedding=model.pos_embed is not None,
        relative_position_bias=attn.relative_position_bias_table is not None,
    ), None


_DESCRIBE = {"Eva": describe_eva, "Beit": describe_beit}


def rows(timm, names):
    out, refused = {}, {}
    for name in names:
        try:
            model = timm.create_model(name, pretrained=False, depth=1)
        except Exception as error:  # noqa: BLE001  recorded, the table goes on
            refused[name] = f"not built by timm here ({type(error).__name__})"
            continue
        try:
            row, why = _DESCRIBE.get(type(model).__name__, describe)(model)
        except AttributeError as error:  # a module layout this table does not know
            row, why = None, f"a layout keras_vit does not read ({error})"
        if row is None:
            refused[name] = why
        else:
            out[name] = row
    return out, refused


def names(timm):
    return sorted(set(timm.list_models("vit_*")) | set(timm.list_models("deit*"))
                  | set(timm.list_models("eva*")) | set(timm.list_models("beit*")))


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
            f'"""What timm {timm.__version__}\'s ViT, DeiT, EVA and BEiT architectures compute '
            "that their weights do not\nshow, by name (written by tools/timm_architectures.py; "
            "do not edit).\n\n`ARCHITECTURES`: name -> mlp ('gelu', 'swiglu'), gelu ('erf', "
            "'tanh', 'quick';\nNone with 'swiglu', whose activation is SiLU), num_heads, "
            "LayerNorm eps, pool\n('token', 'avg', 'map', ''), class_token, reg_tokens, "
            "no_embed_class, pre_norm,\nlayer_scale (the initial gamma, None: none), "
            "fc_norm, patch_bias, distilled;\ntimm's `Eva` (EVA, EVA-02, DINOv3) also rope "
            "(`VisionTransformer(rope=...)`), qkv_bias\n('qkv', 'qv', 'none'), mlp_norm, "
            "position_embedding (`keras_vit.weights.timm_eva`);\ntimm's `Beit` (BEiT, BEiT v2) "
            "those but rope, and relative_position_bias\n(`keras_vit.weights.timm_beit`)."
            "\n`REFUSED`: name -> what "
            'keras_vit does not build.\n"""\n\n'
            f"TIMM_VERSION = {timm.__version__!r}\n\n"
            f"ARCHITECTURES = {_one_per_line(built)}\n\n"
            f"REFUSED = {_one_per_line(refused)}\n")
    with open(OUT, "w") as file:
        file.write(text)
    print(f"{len(built)} architectures, {len(refused)} refused, "
          f"{time.perf_counter() - start:.0f} s -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
