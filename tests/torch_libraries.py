"""timm and transformers where the tests, the benchmarks and the fixture
script open Hub folders with them.

`install_torchvision_stub` / `import_timm`: a stand-in for torchvision,
which has no CPU wheel here: timm imports names from it at import time and
calls none of them on the paths used here (model creation and loading).
Import transformers first: it reads torchvision's version.
`library_logits`: a Hub folder run by the library that opens it, with
its own preprocessing config.

>>> import transformers  # doctest: +SKIP
>>> from torch_libraries import import_timm  # doctest: +SKIP
>>> timm = import_timm()  # doctest: +SKIP
"""

import enum
import sys
import types


def install_torchvision_stub():
    """Registers an importable stand-in for torchvision (timm only needs
    names from it at import time; nothing here calls them)."""
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
        del sys.modules[name]

    def placeholder(name):
        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{name} needs torchvision, which is not importable")
        return type(name, (), {"__init__": unavailable})

    names = {
        "torchvision.ops.misc": ("FrozenBatchNorm2d",),
        "torchvision.datasets": ("CIFAR100", "CIFAR10", "MNIST", "KMNIST",
                                 "FashionMNIST", "ImageFolder"),
        "torchvision.transforms": ("ToTensor",),
        "torchvision.transforms.functional": (),
    }
    modules = {}
    for module_name, members in [("torchvision", ()), ("torchvision.ops", ()), *names.items()]:
        module = types.ModuleType(module_name)
        module.__path__ = []
        for member in members:
            setattr(module, member, placeholder(member))
        modules[module_name] = module
    modes = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
    modules["torchvision.transforms.functional"].InterpolationMode = enum.Enum(
        "InterpolationMode", {m.upper(): m for m in modes})
    modules["torchvision.transforms"].InterpolationMode = \
        modules["torchvision.transforms.functional"].InterpolationMode
    for module_name, module in modules.items():
        parent, _, child = module_name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    sys.modules.update(modules)


def import_timm():
    """`timm`, with torchvision itself when it imports, else the stand-in."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing or a wheel that does not load
        install_torchvision_stub()
    import timm

    return timm


def library_logits(library, folder, photos, timm=None):
    """`library`'s ("timm" or "transformers") own model of the Hub folder
    `folder` on `photos` (uint8-valued float32 NHWC), each normalised with
    the mean/std the folder's config states; `timm`: the module
    (`import_timm()`) for timm folders. transformers builds the class
    config.json's `architectures` names, and must find every weight in the
    folder (no missing, unexpected or mis-shaped key)."""
    import json

    import torch

    config = json.loads((folder / "config.json").read_text())
    if library == "timm":
        model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        mean, std = config["pretrained_cfg"]["mean"], config["pretrained_cfg"]["std"]
    else:
        import transformers

        # the class config.json names, every key of the folder read, none missing
        model, info = getattr(transformers, config["architectures"][0]).from_pretrained(
            folder, output_loading_info=True)
        assert not any(info.values()), info
        model = model.eval()
        processor = json.loads((folder / "preprocessor_config.json").read_text())
        mean, std = processor["image_mean"], processor["image_std"]
    x = torch.from_numpy(photos).permute(0, 3, 1, 2) / 255.0
    x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        out = model(x)
    return (out.logits if hasattr(out, "logits") else out).numpy()
