"""The smallest model of an architecture, from its ``transformers`` config class.

Sizes the checks choose (width, heads, key/value heads) go where every config reads them
(``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, through the
config's own ``attribute_map`` where it names them otherwise); the rest is made small: two
layers, a feed-forward twice the width, a vocabulary of 32 (on both sides of an encoder-decoder,
SIDES). Where the scale is set from a size
(Gemma's ``query_pre_attn_scalar``), that size is the head width, as every config sized like this
one sets it; a sliding window (where the architecture has one) is WINDOW keys. Positions reach
LONGEST, past the longest case. Weights are drawn with std 1/sqrt(width)
(``initializer_range``), as a layer's own ``nn.Linear`` draws them: the library's 0.02 makes
every logit nearly 0 in a model this narrow, so attention would be uniform and every position
alike. Only what the architecture's config has is set: a config keeps any keyword it is given,
and a sliding window on one that has none (Llama's) is read by its cache, which would then keep
the last WINDOW tokens of a layer that sees them all.
"""

from __future__ import annotations

import functools

LAYERS = 2
"""Layers in the model: two, so a layer that depends on the one before it is still reached."""

VOCAB = 32
WINDOW = 4
"""A sliding window where the architecture has one (Mistral's, Gemma 2's sliding layers): 4 keys,
so that the cases longer than it see it (the library's 4096 is wider than any case)."""

LONGEST = 2048
"""Positions the model takes: past the suite's longest case (512 keys) and its benchmark's."""

MELS, SOURCE = 8, 8
"""A speech encoder's input (Whisper's): 8 mel bins, 8 positions (16 frames): its length is
fixed, and the cases replace its layers' input anyway."""

SIDES = {"heads": ("encoder_attention_heads", "decoder_attention_heads"),
         "layers": ("encoder_layers", "decoder_layers", "num_decoder_layers"),
         "feed_forward": ("encoder_ffn_dim", "decoder_ffn_dim", "d_ff")}
"""An encoder-decoder's sizes for each side, where its config names them apart (BART's, T5's,
Whisper's): the same as the single-stack names."""


@functools.cache
def _default(config_class: type):
    """The config with its defaults, read only: made once per class (every build reads it)."""
    try:
        return config_class()
    except Exception:  # a config class that can't be made with its defaults
        return None


def _layer_patterns(default) -> dict[str, object]:
    """Per-layer lists a config validates against its layer count, cut to LAYERS layers with
    their pattern kept: GPT-Neo's ``attention_types`` ([[["global", "local"], 12]] for 24
    layers: one repeat of the pattern per two layers)."""
    types = getattr(default, "attention_types", None)
    if (isinstance(types, list) and types and all(isinstance(t, list) and len(t) == 2
                                                  and isinstance(t[0], list) for t in types)):
        pattern = types[0][0]
        if pattern and LAYERS % len(pattern) == 0:
            return {"attention_types": [[list(pattern), LAYERS // len(pattern)]]}
    return {}


def _read_only(config_class: type, name: str) -> bool:
    """Whether the config computes ``name`` itself (a property without a setter: Falcon's
    ``head_dim``), so that it can't be given."""
    found = getattr(config_class, name, None)
    return isinstance(found, property) and found.fset is None


def _rotary_dims(default, head_dim: int) -> dict[str, int]:
    """A rotated width (GPT-J's and CodeGen's ``rotary_dim``) in the same proportion to the
    head width as the config's defaults, even and at least 2: the library's 64 is wider than a
    tiny model's heads."""
    rotary = getattr(default, "rotary_dim", None)
    width = getattr(default, "hidden_size", None)
    heads = getattr(default, "num_attention_heads", None)
    if not all(isinstance(v, int) and v > 0 for v in (rotary, width, heads)):
        return {}
    share = rotary / (width / heads)
    return {"rotary_dim": max(2, 2 * round(share * head_dim / 2))}


def takes_kv_heads(config_class: type) -> bool:
    """Whether the architecture has grouped key/value heads (its config holds a count of its
    own, not another name for the heads' count: Whisper maps it to its encoder's heads)."""
    return (hasattr(_default(config_class), "num_key_value_heads")
            and "num_key_value_heads" not in getattr(config_class, "attribute_map", {}))


def tiny_config(config_class: type, d_model: int, heads: int, kv_heads: int | None = None,
                attn_implementation: str | None = None):
    """``config_class`` for a model ``d_model`` wide with ``heads`` heads (``kv_heads``
    key/value heads where the architecture groups them), whose layers call the attention
    function registered as ``attn_implementation`` (the model's default where None)."""
    sizes = dict(hidden_size=d_model, num_attention_heads=heads, head_dim=d_model // heads,
                 intermediate_size=2 * d_model, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                 max_position_embeddings=LONGEST, initializer_range=d_model ** -0.5,
                 query_pre_attn_scalar=d_model // heads, sliding_window=WINDOW,
                 window_size=WINDOW)
    default = _default(config_class)
    for size, value in (("heads", heads), ("layers", LAYERS), ("feed_forward", 2 * d_model)):
        sizes.update({name: value for name in SIDES[size] if hasattr(default, name)})
    speech = dict(num_mel_bins=MELS, max_source_positions=SOURCE, max_target_positions=LONGEST)
    sizes.update({name: value for name, value in speech.items() if hasattr(default, name)})
    # Token ids past the small vocabulary (Whisper's 50256) would index past its embedding.
    sizes.update({name: VOCAB - 1 for name, value in vars(default or object()).items()
                  if name.endswith("token_id") and isinstance(value, int) and value >= VOCAB})
    if kv_heads is not None:
        sizes["num_key_value_heads"] = kv_heads
    sizes.update(_layer_patterns(default))
    sizes.update(_rotary_dims(default, d_model // heads))
    if default is not None:  # only what the architecture has (see the module docstring)
        sizes = {name: value for name, value in sizes.items() if hasattr(default, name)
                 and not _read_only(config_class, name)}
    if attn_implementation is not None:
        sizes["attn_implementation"] = attn_implementation
    return config_class(**sizes)
