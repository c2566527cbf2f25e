"""olmoc vs Hugging Face transformers' Olmo3ForCausalLM on the same weights.

transformers has no document masking or z-loss, so this scenario turns both
off; everything else (QK-norm, RoPE, 3:1 sliding/full attention, reordered
norms, SwiGLU, untied head) is exercised.
"""
import pytest

from olmo3_ref import layer_is_full
from test_fidelity import BASE_MODEL, BASE_TRAIN, TOL_FORWARD, TOL_GRAD, random_params, random_tokens, rel_err, run_c

transformers = pytest.importorskip("transformers")


def hf_model(model, params, full_rope=None, max_position_embeddings=4096):
    """transformers' Olmo3ForCausalLM in float64 with params; full_rope: the full-attention layers' RoPE
    parameters (default: unscaled RoPE with the model's theta, as the sliding-window layers')."""
    layer_types = ["full_attention" if layer_is_full(model, l) else "sliding_attention"
                   for l in range(model["n_layers"])]
    unscaled = {"rope_type": "default", "rope_theta": model["rope_theta"]}
    config = transformers.Olmo3Config(
        vocab_size=model["vocab_size"], hidden_size=model["d_model"], intermediate_size=model["mlp_hidden"],
        num_hidden_layers=model["n_layers"], num_attention_heads=model["n_heads"],
        num_key_value_heads=model["n_kv_heads"], rms_norm_eps=model["rms_norm_eps"],
        sliding_window=model["sliding_window"], layer_types=layer_types,
        rope_parameters={"full_attention": full_rope or unscaled, "sliding_attention": unscaled},
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=model["pad_token_id"], eos_token_id=model["eos_token_id"], bos_token_id=None,
        attn_implementation="eager",
    )
    for t in ("full_attention", "sliding_attention"):  # the theta really reached transformers
        assert config.rope_parameters[t]["rope_theta"] == model["rope_theta"]
    hf = transformers.Olmo3ForCausalLM(config).double()
    missing, unexpected = hf.load_state_dict({n: t.double() for n, t in params.items()}, strict=True)
    assert not missing and not unexpected
    return hf


def step_errors(out, hf, batch):
    """transformers' forward and backward pass on batch against olmoc's (run_c's out): its result and the
    relative errors of the logits, the loss and the worst gradient."""
    result = hf(input_ids=batch, labels=batch)
    result.loss.backward()
    logits_err = rel_err(out["logits"], result.logits.detach())
    loss_err = abs(out["losses"][0, 0].item() - result.loss.item()) / result.loss.item()
    grad_err = max(rel_err(out["grad." + n], p.grad) for n, p in hf.named_parameters())
    return result, logits_err, loss_err, grad_err


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_against_transformers(n_kv_heads, build_dir, tmp_path):
    # a theta other than transformers' default, so a dropped setting would show
    model = {**BASE_MODEL, "n_kv_heads": n_kv_heads, "rope_theta": 10000.0}
    train = {**BASE_TRAIN, "steps": 1, "z_loss": 0.0, "intra_doc_masking": False}
    params = random_params(model, seed=11 + n_kv_heads)
    tokens = random_tokens(model, train, seed=3)
    out = run_c(build_dir, tmp_path, model, train, params, tokens)

    _, logits_err, loss_err, grad_err = step_errors(out, hf_model(model, params), tokens[0, 0])
    print(f"\ntransformers kv_heads={n_kv_heads}: logits {logits_err:.2e} loss {loss_err:.2e} grads {grad_err:.2e}")
    assert logits_err < TOL_FORWARD
    assert loss_err < TOL_FORWARD
    assert grad_err < TOL_GRAD
