"""Registering implementations, discovering other packages' through entry points, resolving IMPL.

An IMPL string is a registered name (``seed002-MultiHeadAttention``), ``package.module:Attr`` or
``path/to/file.py::Attr``, where ``Attr`` is an :class:`Implementation` or a list of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path

import torch

from conformance.loading import target_kinds
from conformance.loading.candidates import candidates as _candidates
from conformance.loading.resolve_errors import MissingPackage, ResolveError
from conformance.loading.target_kinds import Request
from conformance.model.capability_groups import DEFAULT_DTYPES, CausalForm, Causality, Dtypes
from conformance.model.declarations import Declarations, merged
from conformance.model.mask_forms import MaskConvention
from conformance.model.spec import (
    CallConvention,
    Capabilities,
    Config,
    FullyMaskedPolicy,
    Implementation,
)
from conformance.model.target_spec import TargetForm, TargetSpec
from conformance.model.weights import WeightLayout

ENTRY_POINT_GROUP = "attention_conformance.implementations"

_registry: dict[str, Implementation] = {}
_entry_points_loaded = False




def _missing_package(error: BaseException, folders: list[Path]) -> str | None:
    """The top-level package ``error`` says is missing, where it is no module of the code's own
    (no ``NAME.py`` or ``NAME/`` in ``folders``, where the code's own modules live)."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.partition(".")[0]
    if any((folder / f"{top}.py").exists() or (folder / top).is_dir() for folder in folders):
        return None  # its own module (or a broken part of it): the code's import error
    return top


KNOWN_PACKAGES = frozenset({
    "numpy", "scipy", "einops", "einx", "opt_einsum", "transformers", "tokenizers",
    "sentencepiece", "datasets", "accelerate", "peft", "safetensors", "huggingface_hub",
    "flash_attn", "flashinfer", "xformers", "triton", "natten", "fla", "liger_kernel",
    "mamba_ssm", "causal_conv1d", "bitsandbytes", "apex", "deepspeed", "torchtune",
    "torchvision", "torchaudio", "torchtext", "timm", "rotary_embedding_torch",
    "x_transformers", "local_attention", "lightning", "pytorch_lightning", "jax", "jaxlib",
    "flax", "optax", "tensorflow", "keras", "sklearn", "pandas", "matplotlib", "seaborn",
    "tqdm", "PIL", "cv2", "yaml", "requests", "wandb", "tensorboard", "hydra", "omegaconf",
    "d2l", "IPython", "ipywidgets", "numba", "cupy", "jaxtyping", "beartype", "typeguard",
    "torch_geometric", "dgl", "pytest", "hypothesis"})
"""Import names of packages on PyPI that attention code imports: one of these missing is the
environment's to install. Any other missing name that is no file of the code's is most likely a
module of its own left out (a student's ``utils.py`` not submitted): the code's import error."""


def _import_failed(error: Exception, what: str, folders: list[Path]) -> ResolveError:
    """The one-line ResolveError for an import of ``what`` that raised ``error``."""
    package = _missing_package(error, folders)
    if package is not None and package in KNOWN_PACKAGES:
        return MissingPackage(f"{what} needs package {package!r}, which is not installed here "
                              f"(pip install {package})", package)
    if package is not None:
        return ResolveError(f"{package}.py not submitted: {what} imports {package!r}, which is "
                            "neither a file beside it nor a package installed here")
    return ResolveError(f"importing {what} raised {type(error).__name__}: {error}")


def register(impl: Implementation) -> Implementation:
    """Add ``impl`` to the registry under its name; a different object under a taken name fails."""
    existing = _registry.get(impl.name)
    if existing is not None and existing is not impl:
        raise ValueError(f"an implementation named {impl.name!r} is already registered")
    _registry[impl.name] = impl
    return impl


def implementation(
    name: str,
    *,
    call: CallConvention = "self",
    mask: MaskConvention | None = None,
    causal: Causality = "never",
    causal_argument: str | None = None,
    cross_attention: bool = False,
    max_len: int | None = None,
    heads: int | None = None,
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES,
    weights: WeightLayout | None = None,
    fully_masked: FullyMaskedPolicy = "report",
    expected_failures: Mapping[str, str] | None = None,
    description: str = "",
) -> Callable[[Callable[[Config], object]], Implementation]:
    """Decorator: declare and register the factory below it as an implementation under test.

    Example::

        @implementation("my-mha", call="qkv", cross_attention=True,
                        mask=MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST),
                        weights=SeparateProjections(q="q", k="k", v="v", o="out"))
        def my_mha(config: Config) -> nn.Module:
            return MyMultiHeadAttention(config.d_model, config.num_heads)
    """
    capabilities = Capabilities(call=call, mask=mask, causality=CausalForm(causal, causal_argument),
                                cross_attention=cross_attention,
                                max_len=max_len, heads=heads, floats=Dtypes(tuple(dtypes)),
                                weights=weights is not None, fully_masked=fully_masked)

    def declare(factory: Callable[[Config], object]) -> Implementation:
        return register(Implementation(
            name=name, factory=factory, capabilities=capabilities, weight_layout=weights,
            expected_failures=dict(expected_failures or {}),
            description=description or (factory.__doc__ or "").strip().split("\n")[0]))

    return declare


def _as_implementations(obj: object, origin: str, declared: Declarations | None = None,
                        named: str | None = None,
                        others: list[str] | None = None) -> list[Implementation]:
    """The implementations ``obj`` gives, by its kind (:mod:`conformance.loading.target_kinds`)."""
    return target_kinds.implementations(obj, Request(origin, declared, named, others,
                                                     _located_object))


def load_entry_points() -> None:
    """Register what every installed package declares under the entry-point group (once)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        obj = entry.load()
        if callable(obj) and not isinstance(obj, Implementation):
            obj = obj()
        for impl in _as_implementations(obj, f"entry point {entry.name!r}"):
            register(impl)


def registered() -> dict[str, Implementation]:
    """Every registered implementation by name, entry points included."""
    load_entry_points()
    return dict(_registry)


def _load_file(path_text: str) -> object:
    path = Path(path_text)
    if not path.is_file():
        raise ResolveError(f"no file {path_text}")
    module_name = f"_attention_conformance_user_{abs(hash(path.resolve()))}"
    if module_name in sys.modules:  # loaded before: its implementations are registered already
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ResolveError(f"cannot load {path_text} as a Python module")
    # As `python path/file.py` does: the file's own folder is importable, so a module split
    # over several files (`from utils import ...`) loads.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ResolveError(f"syntax error in {path_text}, line {error.lineno}: {error.msg}") from error
    except Exception as error:
        raise _import_failed(error, path_text, [path.resolve().parent]) from error
    return module


def _load_module(name: str) -> object:
    # As with `python -m`: a user's own package in the working directory is importable.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except SyntaxError as error:
        raise ResolveError(
            f"syntax error in module {name} ({error.filename}, line {error.lineno}): {error.msg}"
        ) from error
    except ImportError as error:
        missing = getattr(error, "name", None) or ""
        if (_missing_package(error, [Path.cwd()]) is None
                or missing.partition(".")[0] == name.partition(".")[0]):  # the module itself
            raise ResolveError(f"cannot import module {name}: {error}") from error
        raise _import_failed(error, f"module {name}", [Path.cwd()]) from error
    except Exception as error:
        raise _import_failed(error, f"module {name}", [Path.cwd()]) from error


def resolve(spec: str, declared: Declarations | None = None, *, named: str | None = None,
            others: list[str] | None = None) -> list[Implementation]:
    """The implementations an IMPL argument names (where it names several, only the one
    ``named``, if it is one of them, or ``FIRST``: a model's other kinds are then not inferred,
    their names go into ``others``). Raises ResolveError with a one-line reason.

    An undeclared ``nn.Module`` class is inferred; ``declared`` (over what the current
    directory's ``pyproject.toml`` declares for ``spec``) overrides inference item by item.
    """
    from conformance.model.declaration_sources import from_pyproject
    from conformance.model.declarations import DeclarationError, merged

    try:
        declared = merged(from_pyproject(spec), declared or Declarations())
    except DeclarationError as error:
        raise ResolveError(str(error)) from error
    target = TargetSpec.parse(spec)
    if not target.located:
        known = registered()
        if spec in known:
            return [known[spec]]
        raise ResolveError(f"no implementation named {spec!r} (see `attention-conformance list`; "
                           "or give package.module:Attr or path/to/file.py::Attr)")
    return _as_implementations(_located_object(spec), target.origin, declared, named, others)


def _located_object(spec: str) -> object:
    """What a located IMPL string names, its file or module imported; ResolveError, one line,
    where it is not there."""
    container = load_code(spec)
    target = TargetSpec.parse(spec)
    location, attribute = target.location, target.attribute
    if not attribute:
        raise ResolveError(f"{spec}: name the attribute after the colon")
    try:
        return getattr(container, attribute)
    except AttributeError:
        raise ResolveError(f"{location} has no attribute {attribute!r}"
                           + _candidates(container, attribute)) from None


def check_form(spec: str) -> None:
    """ResolveError when a located IMPL string names a file with ``:`` (a module's separator)
    instead of ``::``: one line saying how to write it."""
    why = TargetSpec.parse(spec).misformed()
    if why is not None:
        raise ResolveError(why)


def implementations_of(target: object, declared: Declarations | None = None,
                       directory: Path | None = None) -> list[Implementation]:
    """What any front door is given, as implementations: an :class:`Implementation` (or several),
    a registered name or IMPL string, an ``nn.Module`` class, an instance (checked through its
    class) or a core attention function. ``declared`` overrides inference item by item, over
    what the nearest ``pyproject.toml`` declares for the object (as ``package.module:Name``, its
    file ``path.py::Name``, or ``Name``). Raises ResolveError with a one-line reason."""
    from conformance.model.declaration_sources import from_pyproject, spellings
    from conformance.model.declarations import DeclarationError

    if isinstance(target, str):
        return resolve(target, declared)
    if isinstance(target, Implementation):
        return [target]
    if isinstance(target, Iterable) and not isinstance(target, torch.nn.Module):
        found = [impl for item in target for impl in implementations_of(item, declared,
                                                                          directory)]
        if not found:
            raise ResolveError("nothing to check: the collection is empty")
        return found
    subject = target if isinstance(target, type) or not isinstance(target, torch.nn.Module) \
        else type(target)
    try:
        stated = merged(from_pyproject(spellings(subject, directory), directory),
                        declared or Declarations())
    except DeclarationError as error:
        raise ResolveError(str(error)) from error
    name = getattr(subject, "__name__", None) or type(subject).__name__
    return _as_implementations(target, name, stated)


def load_code(spec: str) -> object:
    """Import the file or module a located IMPL string names (once per process: later calls
    return the same module), running its top level. Raises ResolveError with a one-line reason."""
    check_form(spec)
    target = TargetSpec.parse(spec)
    return (_load_file(target.location) if target.form is TargetForm.FILE
            else _load_module(target.location))
