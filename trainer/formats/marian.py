"""A Hugging Face Marian checkpoint (MarianMTModel, the OPUS-MT models) as files and tensor
names: the one map that the conversion (trainer/conversion/marian.py) reads and the
export back to Marian (trainer/serving/marian.py) writes."""

from typing import List, NamedTuple, Optional, Tuple

# The checkpoint's weights, and an older checkpoint's pickled ones (read only with torch).
WEIGHTS = "model.safetensors"
PICKLED_WEIGHTS = "pytorch_model.bin"


class TorchLayout(NamedTuple):
    """How a Marian tensor holds one of our variables: transposed (a torch Linear's
    weight [out, in] is a Dense kernel [in, out]), and which of its axes, if any, runs
    over the model's width d_model (what trainer/serving/marian.py permutes)."""

    transposed: bool
    width_axis: Optional[int]


def layer_tensors(model) -> List[Tuple[str, object, TorchLayout]]:
    """(Marian tensor name without MarianMTModel's "model.", our variable, its
    TorchLayout) of every weight of a Transformer's encoder and decoder layers."""
    tensors = []

    def linear(name, dense, width_axis):  # torch [out, in]: the input is axis 1
        tensors.append((f"{name}.weight", dense.kernel, TorchLayout(True, width_axis)))
        tensors.append((f"{name}.bias", dense.bias,
                        TorchLayout(False, 0 if width_axis == 0 else None)))

    def attention(name, layer):
        for projection, dense in (("q_proj", layer.query_dense), ("k_proj", layer.key_dense),
                                  ("v_proj", layer.value_dense)):
            linear(f"{name}.{projection}", dense, 1)
        linear(f"{name}.out_proj", layer.output_dense, 0)

    def layer_norm(name, residual):
        tensors.append((f"{name}.weight", residual.layer_norm.gamma, TorchLayout(False, 0)))
        tensors.append((f"{name}.bias", residual.layer_norm.beta, TorchLayout(False, 0)))

    for stack, layers in (("encoder", model.encoder.layers), ("decoder", model.decoder.layers)):
        for i, layer in enumerate(layers):
            name = f"{stack}.layers.{i}"
            attention(f"{name}.self_attn", layer.self_attention)
            layer_norm(f"{name}.self_attn_layer_norm", layer.self_attention_residual)
            if stack == "decoder":
                attention(f"{name}.encoder_attn", layer.cross_attention)
                layer_norm(f"{name}.encoder_attn_layer_norm", layer.cross_attention_residual)
            linear(f"{name}.fc1", layer.feed_forward.inner, 1)
            linear(f"{name}.fc2", layer.feed_forward.outer, 0)
            layer_norm(f"{name}.final_layer_norm", layer.feed_forward_residual)
    return tensors
