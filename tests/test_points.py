"""Named intervention points (``selfattn.hooks``): what each point holds and what a change there does, against transformers.

The model is a tiny random Llama with grouped key/value heads (4 query heads, 2 key/value
heads, Llama 3.2's RoPE scaling), loaded by us and, with the same weights, by transformers
(eager attention). What a point holds is read from transformers' own modules: the hidden
states, the attention weights, the inputs and outputs of its projections (RoPE applied by
its own ``apply_rotary_pos_emb``), its MLP's output. A change at a point is checked against
the same change made by a hook on transformers' module that computes it.
"""

from __future__ import annotations

import pytest
import torch

import selfattn as sa
from selfattn.attention.points import POINTS, parse_point_name, point_name
from tests.tiny_models import reference_model, tiny_checkpoint

transformers = pytest.importorskip("transformers")
TEXT = "The cat sat on the warm mat. The cat"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return sa.load_pretrained(folder), reference_model(folder)


def hf_values(hf, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every point's value in transformers' forward, in our names and axis order."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    c = hf.config
    H, Hkv, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads
    seen, handles = {}, []

    def keep(name, what="output"):
        def hook(module, args, output):
            seen[name] = (args[0] if what == "input" else output).detach()
        return hook

    for l, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        handles += [attn.q_proj.register_forward_hook(keep(f"{l}.q")), attn.k_proj.register_forward_hook(keep(f"{l}.k")),
                    attn.v_proj.register_forward_hook(keep(f"{l}.v")),
                    attn.o_proj.register_forward_hook(keep(f"{l}.z", "input")),
                    attn.o_proj.register_forward_hook(keep(f"{l}.attn_out")), layer.mlp.register_forward_hook(keep(f"{l}.mlp_out"))]
    try:
        with torch.no_grad():
            out = hf(ids, output_hidden_states=True, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    positions = torch.arange(ids.shape[1])[None]
    cos, sin = hf.model.rotary_emb(out.hidden_states[0], positions)
    values = {}
    batch, seq = ids.shape
    for l in range(c.num_hidden_layers):
        split = lambda x, n: x.view(batch, seq, n, d).transpose(1, 2)  # noqa: E731  (batch, n, seq, d)
        q, k = apply_rotary_pos_emb(split(seen[f"{l}.q"], H), split(seen[f"{l}.k"], Hkv), cos, sin)
        z = split(seen[f"{l}.z"], H)
        w_o = hf.model.layers[l].self_attn.o_proj.weight.view(c.hidden_size, H, d)
        values.update({
            point_name(l, "resid_pre"): out.hidden_states[l], point_name(l, "q"): q, point_name(l, "k"): k,
            point_name(l, "v"): split(seen[f"{l}.v"], Hkv), point_name(l, "pattern"): out.attentions[l],
            point_name(l, "z"): z, point_name(l, "result"): torch.einsum("bhqe,dhe->bqhd", z, w_o),
            point_name(l, "attn_out"): seen[f"{l}.attn_out"], point_name(l, "mlp_out"): seen[f"{l}.mlp_out"],
        })
        if l + 1 < c.num_hidden_layers:  # transformers' last hidden state is after the final norm
            values[point_name(l, "resid_post")] = out.hidden_states[l + 1]
    return values


def test_every_point_holds_what_transformers_computes_there(llama):
    ours, hf = llama
    ids = ours.tokenize(TEXT).input_ids
    expected = hf_values(hf, ids)
    names = sa.point_names(ours)
    assert len(names) == len(POINTS) * 2 and names[0] == "blocks.0.hook_resid_pre"
    with sa.capture(ours, names) as seen, torch.no_grad():
        ours(ids)
    assert set(seen) == set(names)
    for name, value in expected.items():
        torch.testing.assert_close(seen[name], value, atol=2e-5, rtol=1e-4, msg=name)
    # The last block's output is the stream the final norm reads.
    torch.testing.assert_close(ours.norm(seen["blocks.1.hook_resid_post"]), ours(ids, output_hidden_states=True).hidden_states[-1])
    # Attention far from uniform, or the comparison could not see a scale or a mask.
    assert float(seen["blocks.1.attn.hook_pattern"][0, :, 5:].max(dim=-1).values.mean()) > 0.4  # uniform: under 0.2


def change_in_transformers(hf, module_name: str, change, pre: bool = False):
    module = hf.get_submodule(module_name)
    if pre:
        return module.register_forward_pre_hook(lambda m, args: (change(args[0]),) + args[1:])
    return module.register_forward_hook(lambda m, args, output: change(output))


def sliced(width: int, index: int, factor: float):
    def change(x):
        x = x.clone()
        x[..., index * width:(index + 1) * width] *= factor
        return x
    return change


@pytest.mark.parametrize(("point", "module", "index"), [
    ("q", "model.layers.1.self_attn.q_proj", 2),  # query head 2
    ("k", "model.layers.1.self_attn.k_proj", 1),  # key/value head 1: query heads 2 and 3 read it
    ("v", "model.layers.0.self_attn.v_proj", 0),
    ("z", "model.layers.0.self_attn.o_proj", 3),
])
def test_a_change_at_a_head_point_is_the_same_change_in_transformers(llama, point, module, index):
    ours, hf = llama
    ids = ours.tokenize(TEXT).input_ids
    layer = int(module.split(".")[2])

    def ours_change(value, where):
        assert where.name == point_name(layer, point) and where.layer == layer and where.past == 0 and where.real is None
        value = value.clone()
        value[:, index] *= 3.0  # RoPE is linear: scaling after it is scaling before it
        return value

    d = hf.config.hidden_size // hf.config.num_attention_heads
    handle = change_in_transformers(hf, module, sliced(d, index, 3.0), pre=point == "z")
    try:
        with torch.no_grad():
            expected = hf(ids).logits
    finally:
        handle.remove()
    with sa.hooks(ours, {point_name(layer, point): ours_change}), torch.no_grad():
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    assert (got - ours(ids).logits).abs().max() > 1e-2  # the change showed


def test_residual_and_mlp_points_change_what_transformers_changes(llama):
    ours, hf = llama
    ids = ours.tokenize(TEXT).input_ids
    push = torch.randn(hf.config.hidden_size, generator=torch.Generator().manual_seed(0))
    handles = [hf.model.layers[1].register_forward_pre_hook(lambda m, args, kwargs: ((args[0] + push,) if args else args,
                                                                                    {**kwargs, "hidden_states": kwargs["hidden_states"] + push}
                                                                                    if "hidden_states" in kwargs else kwargs),
                                                           with_kwargs=True),
               hf.model.layers[0].mlp.register_forward_hook(lambda m, args, output: output * 0)]
    try:
        with torch.no_grad():
            expected = hf(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    table = {"blocks.1.hook_resid_pre": lambda x, p: x + push, "blocks.0.hook_mlp_out": lambda x, p: x * 0}
    with sa.hooks(ours, table), torch.no_grad():
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_result_is_each_heads_share_and_a_changed_pattern_is_what_the_heads_mix(llama):
    ours, _ = llama
    ids = ours.tokenize(TEXT).input_ids
    with sa.capture(ours, ["blocks.1.attn.hook_result", "blocks.1.hook_attn_out"]) as seen, torch.no_grad():
        ours(ids)
    torch.testing.assert_close(seen["blocks.1.attn.hook_result"].sum(dim=-2), seen["blocks.1.hook_attn_out"])

    def zero_result(result, point):
        result = result.clone()
        result[:, :, 2] = 0
        return result

    def zero_z(z, point):
        z = z.clone()
        z[:, 2] = 0
        return z

    with torch.no_grad():
        with sa.hooks(ours, {"blocks.1.attn.hook_result": zero_result}):
            by_result = ours(ids).logits
        with sa.hooks(ours, {"blocks.1.attn.hook_z": zero_z}):
            by_z = ours(ids).logits
    torch.testing.assert_close(by_result, by_z, atol=1e-5, rtol=1e-5)

    def first_token(weights, point):  # every query of head 1 reads the first token alone
        weights = weights.clone()
        weights[:, 1] = 0
        weights[:, 1, :, 0] = 1
        return weights

    with sa.hooks(ours, {"blocks.0.attn.hook_pattern": first_token}), sa.capture(
            ours, ["blocks.0.attn.hook_z", "blocks.0.attn.hook_v", "blocks.0.attn.hook_pattern"]) as seen, torch.no_grad():
        ours(ids)
    kv = seen["blocks.0.attn.hook_v"][:, 0]  # head 1 reads key/value head 0
    torch.testing.assert_close(seen["blocks.0.attn.hook_z"][:, 1], kv[:, :1].expand(-1, ids.shape[1], -1))
    # Hooks run in the order set: the recording, set after the change, sees the changed pattern.
    assert float(seen["blocks.0.attn.hook_pattern"][0, 1, :, 0].min()) == 1.0


def test_a_point_is_told_the_padding_and_the_cache(llama):
    ours, _ = llama
    told = []
    with sa.hooks(ours, {"blocks.0.attn.hook_z": lambda z, p: told.append((p.real, p.past, tuple(z.shape)))}):
        with torch.no_grad():
            ours(["The cat", "The cat sat on the mat"])
        encoded = ours.tokenize(["The cat", "The cat sat on the mat"])
        assert torch.equal(told[0][0], encoded.attention_mask.bool())
        told.clear()
        ours.generate("The cat", 3)
    prompt = len(ours.tokenize("The cat").tokens[0])
    assert [(real, past) for real, past, _ in told] == [(None, 0), (None, prompt), (None, prompt + 1)]
    assert [shape[2] for _, _, shape in told] == [prompt, 1, 1]
    with sa.hooks(ours, {"blocks.1.attn.hook_k": lambda k, p: told.append(p)}), torch.no_grad():
        ours("The cat")
    point = told[-1]
    assert (point.n_heads, point.n_kv_heads) == (4, 2)
    assert [point.kv_head(h) for h in range(4)] == [0, 0, 1, 1] and point.query_heads(1) == [2, 3]


def test_bad_hooks_are_refused_and_nothing_stays_behind(llama):
    ours, _ = llama
    with pytest.raises(sa.OptionError, match="no intervention point 'blocks.0.attn.hook_zz'.*did you mean 'z'"):
        with sa.hooks(ours, {"blocks.0.attn.hook_zz": lambda z, p: None}):
            pass
    with pytest.raises(sa.OptionError, match="layer 5 is out of range: this model has 2 layers"):
        with sa.hooks(ours, {"blocks.5.hook_resid_pre": lambda x, p: None}):
            pass
    with pytest.raises(sa.OptionError, match="must be a function"):
        with sa.hooks(ours, {"blocks.0.hook_resid_pre": 3}):
            pass
    with pytest.raises(sa.ShapeError, match=r"a hook at blocks.0.attn.hook_z must return a tensor of shape \(1, 4, "):
        with sa.hooks(ours, {"blocks.0.attn.hook_z": lambda z, p: z[:, :2]}), torch.no_grad():
            ours("The cat")
    assert all(getattr(m, "points", None) is None for m in ours.modules())
    assert parse_point_name("blocks.0.hook_q") is None and parse_point_name("blocks.0.attn.hook_resid_pre") is None


def test_hooks_keep_the_fast_paths_they_can(llama):
    ours, _ = llama
    module = ours.blocks[0].attention
    x = torch.randn(1, 40, module.config.d_model)
    with sa.hooks(ours, {"blocks.0.attn.hook_z": lambda z, p: z}):
        assert module.path_for(x, is_causal=True).name == "reference"  # attn_impl "reference": the module's own
    flash = sa.MultiHeadAttention(32, 4, attn_impl="flash")
    holder = sa.Transformer(sa.TransformerConfig(d_model=32, n_heads=4, n_layers=1, causal=True))
    holder.layers[0].attention = flash
    with sa.hooks(holder, {"blocks.0.attn.hook_z": lambda z, p: z * 2}):
        assert flash.path_for(torch.randn(1, 40, 32), is_causal=True).name == "flash"
        y = torch.randn(1, 40, 32)
        doubled = flash(y, is_causal=True)
    with sa.hooks(holder, {"blocks.0.attn.hook_pattern": lambda a, p: a}):
        choice = flash.path_for(torch.randn(1, 40, 32), is_causal=True)
        assert choice.name == "reference" and "attention pattern" in choice.declined["flash"]
    with torch.no_grad():
        torch.testing.assert_close(doubled, 2 * flash(y, is_causal=True) - flash.w_o.bias, atol=1e-5, rtol=1e-5)
    trained = sa.Transformer(sa.TransformerConfig(d_model=32, n_heads=4, n_layers=1, causal=True))
    with sa.hooks(trained, {"blocks.0.attn.hook_z": lambda z, p: z}):
        choice = trained.layers[0].attention.path_for(torch.randn(1, 5, 32, requires_grad=True), is_causal=True)
        assert choice.name == "reference" and "hooks" in choice.declined["packed"]
    assert trained.layers[0].attention.path_for(torch.randn(1, 5, 32, requires_grad=True), is_causal=True).name == "packed"
