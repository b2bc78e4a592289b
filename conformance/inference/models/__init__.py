"""Attention where it lives: a model class is a target. The smallest model of its architecture is
built from its config class (:mod:`.tiny_config`), its attention layers are found by behaviour
(:mod:`.attention_layers`), and each kind is checked driven through its own model
(:class:`conformance.subject.layer_in_model.LayerInModel`)."""
