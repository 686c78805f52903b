"""The walkthrough of one head of a pretrained model, as a Document built from its ``AttentionTrace``.

The seed's steps (tokens, embeddings, scores, softmax, context) on a real model's learned
numbers, for any family we load. What differs between models (encoder or decoder, the
embedding's parts, pre- or post-norm, RoPE, grouped-query heads, a sliding window) is
read from the record's "model" section (its ``embedding`` and each layer's
``AttentionInfo``), never from the family's name. Wide vectors are shown by their first
and last components and their length. All numbers come from the trace; nothing here
computes attention.
"""

from __future__ import annotations

import math
import shlex

from selfattn.render.text.command_output import command_lines
from selfattn.render.text.document import (
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    Table,
    component_headers,
    display_token,
    fmt,
    fmt_vector,
    vector_cells,
)
from selfattn.render.text.model_input import (
    FEED_FORWARD, NORM_TEXT, NORMS, SPECIAL_SHARE_NOTED, TOP_SHOWN, embeddings_step, layers_before,
    hidden_name, intro_step, is_special, key_span, query_label, rope_base_text,
    seen_keys, token_label, tokens_step, vector_length, wide_table,
)
from selfattn.trace.record import AttentionTrace

def model_steps(doc: Document, t: AttentionTrace, p: int) -> None:
    """Every step of layer ``t.layer``, head ``t.head`` for the query, in reading order."""
    intro_step(doc, t)
    tokens_step(doc, t)
    embeddings_step(doc, t, p)
    step = 3
    if t.layer > 0 or t.sections["model"].infos[t.layer].norm_first:
        _layer_input(doc, t, p, step)
        step += 1
    _projections(doc, t, p, step)
    _softmax(doc, t, p, step + 1)
    _context(doc, t, p, step + 2)
    _after_the_head(doc, t, p)




def _layer_input(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    m = t.sections["model"]
    a, layer, x = m.infos[t.layer], t.layer, hidden_name(t.layer)
    norm = NORMS.get(a.norm, a.norm)
    if layer > 0:
        doc.add(
            Heading(f"Step {step} · The input of layer {layer}" + (f", and the {norm} its attention reads" if a.norm_first else "")),
            Paragraph(
                f"Layer {layer} does not read the embeddings themselves but what {layers_before(layer)} made of them: each "
                "layer mixes information between the tokens (attention) and then reworks each token on its own (a "
                f"feed-forward network), so a token's vector now carries some of its context. This is {x}, "
                f"still {len(t.tokens)} × {int(t.embeddings.shape[-1])}."
            ),
            *wide_table(t, m.hidden_states[t.layer], p, f"{x}: the hidden states entering layer {layer}"),
        )
    else:
        doc.add(Heading(f"Step {step} · What the attention of layer 0 reads: {norm}(X₀)"))
    if a.norm_first:
        doc.add(
            Paragraph(
                f"This model normalises before each part of a layer (pre-norm): the attention of layer {layer} reads "
                f"{norm}({x}), not {x} itself, and its output is added back to {x}, which is never normalised in "
                f"place (the residual connection)"
                + (f"; the output is normalised once more by {norm} before it is added" if a.sandwich_norm else "")
                + f". {NORM_TEXT.get(a.norm, '')}"
                + (" This checkpoint stores each gain minus one: its RMSNorm multiplies by 1 + g." if a.norm_gain == "1+w" else "")
            ),
            *wide_table(t, t.steps.input, p, f"{norm}({x}): what the attention of layer {layer} reads"),
        )


def _heads_text(t: AttentionTrace, step: int) -> str:
    s, h = t.steps, t.head
    a, d_head, d_model = t.sections["model"].infos[t.layer], int(s.q.shape[-1]), int(t.embeddings.shape[-1])
    first, kv = h * d_head, s.kv_head_of[h]
    x = f"x (here {NORMS.get(a.norm, a.norm)}(x), the step before)" if a.norm_first else "x"
    text = (
        f"Each token's vector {x} is projected three ways by learned matrices (some models also add a learned bias "
        "vector to each): the query q (what the token is looking for), the key k (what it offers to be found by) and "
        f"the value v (what it hands over). W_q is {d_model} × {t.n_heads * d_head}: its columns are {t.n_heads} groups "
        f"of {d_head}, one group per head, and head {h} uses columns {first} to {first + d_head - 1}."
    )
    if a.n_kv_heads < a.n_heads:
        text += (
            f" W_k and W_v are narrower, {d_model} × {a.n_kv_heads * d_head}: {a.n_kv_heads} group{'s' if a.n_kv_heads > 1 else ''} "
            f"of {d_head}, one per key/value head, and each key/value head serves {a.group_size} query heads. So head {h} "
            f"reads the keys and values of key/value head {kv} (columns {kv * d_head} to {kv * d_head + d_head - 1} of W_k and W_v)."
        )
    else:
        text += " W_k and W_v are cut into heads the same way."
    if a.qk_norm:
        gain = "1 + g, the checkpoint storing g" if a.norm_gain == "1+w" else "a learned gain g"
        text += (
            f" Right after the projection this model passes every head's q and k through an RMSNorm of their own "
            f"over the {d_head} numbers (q_norm and k_norm, times {gain}), so every q and k comes out at about the "
            "same size and how sharp the head's weights are is set by those gains, not by how large x happens to be. "
            "The q and k below are after that norm."
        )
    return text + f" In this head every q, k and v has {d_head} numbers; v comes in at step {step + 2}."


def _kv_name(t: AttentionTrace) -> str:
    a = t.sections["model"].infos[t.layer]
    return f"key/value head {t.steps.kv_head_of[t.head]}" if a.n_kv_heads < a.n_heads else f"head {t.head}"


def _rope(doc: Document, t: AttentionTrace, p: int) -> None:
    s, h = t.steps, t.head
    kv = s.kv_head_of[h]
    a, q, d_head = t.sections["model"].infos[t.layer], t.query.index, int(s.q.shape[-1])
    seen = seen_keys(t, q)
    others = [j for j in seen if j not in (0, q)] or [j for j in seen if j != q] or [q]  # token 0 is not turned
    j = max(others, key=lambda k: float(s.weights[h, q, k]))  # the key the query weighs most
    before = float(s.scores_plain[h, q, j])  # q . k before the turn, as the trace recorded it
    scaling = f" This checkpoint rescales the frequencies θ_c first ({a.rope_scaling})." if a.rope_scaling else ""
    pairs = [(f"q at {q}, before", s.q_plain[h, q]), (f"q at {q}, after", s.q[h, q]),
             (f"k at {j}, before", s.k_plain[kv, j]), (f"k at {j}, after", s.k[kv, j])]
    rows = [[name] + vector_cells(v.tolist(), p) + [fmt(vector_length(v), p)] for name, v in pairs]
    doc.add(
        Paragraph(
            f"Positions enter here, through RoPE: before any score is taken, each query and key is turned by its "
            f"position. Its {d_head} components form {d_head // 2} pairs{_pairs_text(a.rope_pairs, d_head)}, and pair c of the token at position i turns by the "
            f"angle i·θ_c, with θ_c = {rope_base_text(a.rope_base)}^(−2c/{d_head}): the first pairs turn fast, the last ones slowly."
            f"{scaling} A turn changes no length, only the direction. The query at position {q} turns by {q}·θ_c and "
            f"the key at position {j} by {j}·θ_c; in their dot product only the difference of the angles is left, "
            f"({q} − {j})·θ_c, so the score depends on how far apart the two tokens are ({abs(q - j)} position{'' if abs(q - j) == 1 else 's'}), not "
            "on where they stand."
        ),
        Table(["RoPE"] + component_headers(d_head, "x") + ["|x|"], rows,
              title=f"RoPE turns the query {query_label(t)} and the key of '{token_label(t, j)}'"),
        Lines([f"q · k before the turn = {fmt(before, p)}   after the turn = {fmt(s.scores[h, q, j], p)}"]),
    )


def _pairs_text(pairs: str | None, d_head: int) -> str:
    """Which components RoPE turns together, 1-based as the tables count them: ' (x1 with x2, ...)'."""
    if pairs == "interleaved":
        return " of neighbours (x1 with x2, x3 with x4, …)"
    if pairs == "half":
        half = d_head // 2
        return f" (x1 with x{half + 1}, x2 with x{half + 2}, …, x{half} with x{d_head})"
    return ""


def _projections(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, h = t.steps, t.head
    kv = s.kv_head_of[h]
    q, d_head = t.query.index, int(s.q.shape[-1])
    rope = t.sections["model"].infos[t.layer].positional == "rope" and s.q_plain is not None and s.k_plain is not None
    rows = [[token_label(t, j)] + vector_cells(s.k[kv, j].tolist(), p) + [fmt(s.scores[h, q, j], p)]
            for j in range(len(t.tokens))]
    doc.add(Heading(f"Step {step} · Queries and keys of head {h}: q = x W_q, k = x W_k"), Paragraph(_heads_text(t, step)))
    if rope:
        _rope(doc, t, p)
    after = " (after RoPE)" if rope else ""
    hidden = " Every key gets a score here, also those the mask hides in the next step." if s.allowed is not None else ""
    doc.add(
        Lines([f"q of {query_label(t)}{after} = {fmt_vector(s.q[h, q].tolist(), p)}",
               f"|q| = {fmt(vector_length(s.q[h, q]), p)}"]),
        Paragraph(
            f"The score of key j is the dot product q · k_j: multiply the {d_head} pairs of components and add them "
            f"up. The better key j matches what {query_label(t)} is looking for, the larger its score.{hidden}"
        ),
        Table(["token"] + component_headers(d_head, "k") + ["q · k"], rows, title=f"Every token's key in {_kv_name(t)}{after}, and its score", highlight_row=q),
    )


def _mask_text(t: AttentionTrace, seen: list[int]) -> str:
    a, q, n = t.sections["model"].infos[t.layer], t.query.index, len(t.tokens)
    reasons = []
    if a.causal:
        reasons.append("the causal mask hides every later token, since a model that predicts the next token may not look ahead")
    if a.window is not None:
        if seen[0] > 0:
            reasons.append(f"layer {t.layer}'s sliding window of {a.window} keeps only the {a.window} newest keys, so the "
                           f"tokens before position {seen[0]} are hidden too")
        else:
            reasons.append(f"layer {t.layer}'s sliding window of {a.window} hides nothing yet: it hides older tokens "
                           f"only for queries at position {a.window} and later")
    why = "; ".join(reasons) if reasons else "the mask hides the others"
    return (
        f"{query_label(t)} (position {q}) may see {len(seen)} of the {n} keys, {key_span(seen)}: {why}. The mask sets the "
        "score of every hidden key to -inf before the softmax, so exp gives 0 and its weight α is exactly 0."
    )


def _softmax(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, h = t.steps, t.head
    q, n, d_head = t.query.index, len(t.tokens), int(s.q.shape[-1])
    seen = seen_keys(t, q)
    masked = s.allowed is not None
    columns = [s.scores[h, q], s.masked[h, q], s.exp[h, q], s.weights[h, q]]
    rows = [[token_label(t, j)] + [fmt(col[j], p) for col in columns] + (["" if j in seen else "hidden"] if masked else []) for j in range(n)]
    add_up = ("The weights α of the keys it may see are positive and add up to 1; the hidden ones get 0."
              if masked else "The weights α are positive and add up to 1.")
    doc.add(Heading(f"Step {step} · Scaling and softmax for {query_label(t)}"))
    if masked:
        doc.add(Paragraph(_mask_text(t, seen)))
    over = f" over the {len(seen)} key{'s' if len(seen) > 1 else ''} it may see" if masked else ""
    if not math.isclose(s.scale, d_head ** -0.5):  # the checkpoint's own scale (Gemma 3's 1 / sqrt(query_pre_attn_scalar))
        root = 1 / s.scale ** 2
        shown = f"{root:g}" if math.isclose(root, round(root)) else fmt(root, p)
        scaling = (
            f"Before the softmax every score is multiplied by this checkpoint's own scale, {fmt(s.scale, p)} = "
            f"1/√{shown}, in place of the usual 1/√{d_head}: a sum of {d_head} products spreads about √{d_head} "
            "times wider than one product, and the model was trained with this factor to keep its scores in "
            "range."
        )
        column = f"s = q · k × {fmt(s.scale, p)}"
    else:
        scaling = (
            f"Before the softmax every score is divided by √{d_head} = {fmt(math.sqrt(d_head), p)} (times "
            f"{fmt(s.scale, p)}). A sum of {d_head} products spreads about √{d_head} times wider than one product, "
            "and softmax over widely spread scores hands nearly all the weight to one token, where learning "
            "stalls."
        )
        column = f"s = q · k / √{d_head}"
    doc.add(
        Paragraph(
            f"{scaling} Then the softmax, in its stable form: subtract the largest scaled score m, take exp, and "
            f"divide each by their sum. {add_up}"
        ),
        Table(["token", "q · k", column, "exp(s - m)", "α"] + ([""] if masked else []), rows, highlight_row=q),
        Lines([f"m = {fmt(s.row_max[h, q], p)}   sum of exp(s - m) = {fmt(s.exp_sum[h, q], p)}   "
               f"sum of α{over} = {fmt(s.weights[h, q, seen].sum(), p)}"]),
    )
    order = sorted(seen, key=lambda j: -float(s.weights[h, q, j]))
    decimals = max(p - 2, 0)
    top = ", ".join(f"'{token_label(t, j)}' {100 * float(s.weights[h, q, j]):.{decimals}f}%" for j in order[:TOP_SHOWN])
    doc.add(Paragraph(f"In layer {t.layer}, head {h}, {query_label(t)} puts the most weight on {top}."))
    if t.sections["model"].infos[t.layer].causal:
        return  # a decoder's first token is explained after the head (the attention sink)
    special = [j for j in range(n) if is_special(t, j) and j != q]
    share = float(sum(float(s.weights[h, q, j]) for j in special))
    if share >= SPECIAL_SHARE_NOTED:
        doc.add(
            Note(
                f"{100 * share:.{decimals}f}% of the weight goes to {' and '.join(sorted({t.tokens[j] for j in special}))}. "
                "Trained heads often do this "
                "when what they look for is not in the sentence: the special tokens are always there, so they "
                "serve as a place to park weight, a way for the head to change the token very little."
            )
        )


def _context(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, h = t.steps, t.head
    kv = s.kv_head_of[h]
    q, d_head = t.query.index, int(s.q.shape[-1])
    rows = [[token_label(t, j), fmt(s.weights[h, q, j], p)] + vector_cells(s.v[kv, j].tolist(), p)
            for j in range(len(t.tokens))]
    hidden = " The hidden keys have α = 0, so their values add nothing." if s.allowed is not None else ""
    doc.add(
        Heading(f"Step {step} · Head {h}'s output for {query_label(t)}: z = Σ α_j v_j"),
        Paragraph(
            f"The head hands back a blend of the value vectors, each scaled by its weight: {d_head} numbers for "
            f"{query_label(t)}. Tokens with a large α pull the blend towards their own v.{hidden}"
        ),
        Table(["token", "α"] + component_headers(d_head, "v"), rows, title=f"Every token's value in {_kv_name(t)}", highlight_row=q),
        Lines([f"z of {query_label(t)} = {fmt_vector(s.context[h, q].tolist(), p)}",
               f"|z| = {fmt(vector_length(s.context[h, q]), p)}"]),
    )


def _shell_quoted(sentence: str) -> str:
    """The sentence quoted so a shell passes it unchanged, or a placeholder when that is not simple."""
    if len(sentence) > 60 or not sentence.isprintable():
        return '"your sentence"'
    if not any(c in sentence for c in '"$`\\!'):
        return f'"{sentence}"'
    if "'" not in sentence:
        return f"'{sentence}'"  # nothing expands inside single quotes
    return '"your sentence"'


def _rest_of_layer(t: AttentionTrace) -> str:
    m, layer, d_head, d_model = t.sections["model"], t.layer, int(t.steps.q.shape[-1]), int(t.embeddings.shape[-1])
    a, width = m.infos[layer], t.n_heads * d_head
    norm, ff = NORMS.get(a.norm, a.norm), FEED_FORWARD.get(a.feed_forward, a.feed_forward)
    result = "the model's final vectors" + (f", after one last {norm}" if a.norm_first else "")
    if layer < t.n_layers - 1:
        result = f"the input of the next layer, layer {layer + 1}"
    elif a.causal:
        result += "; the last token's vector, multiplied by the output matrix, scores every token of the vocabulary as the next one"
    elif m.default_model:
        result += "; for a sentence embedding, the model averages them over the tokens (see selfattn similarity)"
    own = (f"W_q (and, shared with the other query heads of its group, {d_head} columns of W_k and W_v)"
           if a.n_kv_heads < a.n_heads else "W_q, W_k and W_v")
    joined = (
        f"Head {t.head} is one of {t.n_heads} heads that run side by side on the same input, each with its own "
        f"{d_head} columns of {own}, so each can look for something else. Their {t.n_heads} outputs of "
        f"{d_head} numbers are laid side by side into {width}, multiplied by W_o ({width} × {d_model}) and "
        "added to the layer's input (the residual connection)"
    )
    if a.norm_first and a.sandwich_norm:
        joined = joined.replace(" and added to the layer's input", f", normalised once more by {norm} and added to the layer's input")
        rest = (f". Then a feed-forward network reworks each token on its own: it reads {norm} of that sum ({ff}), "
                f"and its output, normalised by {norm} again, is added to the sum.")
    elif a.norm_first:
        rest = f". Then a feed-forward network reworks each token on its own: it reads {norm} of that sum ({ff}), and its output is added to the sum again."
    else:
        rest = f", then normalised by {norm}. Then a feed-forward network reworks each token on its own ({ff}), with another residual add and {norm}."
    return joined + rest + f" The result is layer {layer}'s output, {result}."


def _sink(t: AttentionTrace, p: int) -> Paragraph:
    """The decoder's first token as a place to park weight: this head's share on it, and the query's.

    Only for two tokens or more: the share is the mean weight on token 0 of the queries after it.
    """
    s, h, q = t.steps, t.head, t.query.index
    decimals = max(p - 2, 0)
    share, own = 100 * float(s.weights[h, 1:, 0].mean()), 100 * float(s.weights[h, q, 0])
    alone = f" ({query_label(t)} is token 0 itself, so it may see only itself.)" if q == 0 else ""
    blind = [i for i in range(1, len(t.tokens)) if s.allowed is not None and not bool(s.allowed[i, 0])]
    window = (f" Here layer {t.layer}'s sliding window hides token 0 from the {len(blind)} queries at {key_span(blind)}, "
              "which count with weight 0 in that average." if blind else "")
    builtin = t.sections["model"].builtin
    untrained = "" if builtin else " In an untrained checkpoint the share is an accident of the random weights."
    return Paragraph(
        f"The first token: in this head the tokens after token 0 ('{token_label(t, 0)}') put on average {share:.{decimals}f}% "
        f"of their weight on it, and {query_label(t)} puts {own:.{decimals}f}% on it.{alone} Many trained decoders park "
        "weight there when a head has nothing to look for: under the causal mask token 0 is the one key that every "
        "query may see, and a head whose weight sits on it adds nearly the same vector, token 0's value, to every "
        f"token, which is close to doing nothing. This is called an attention sink.{window}{untrained}"
    )


def _after_the_head(doc: Document, t: AttentionTrace, p: int) -> None:
    m = t.sections["model"]
    q, a, output = t.query.index, m.infos[t.layer], m.hidden_states[t.layer + 1]
    doc.add(
        Heading(f"After head {t.head}: the rest of layer {t.layer}"),
        Paragraph(_rest_of_layer(t)),
        Lines([f"layer {t.layer}'s output for {query_label(t)} = {fmt_vector(output[q].tolist(), p)}"]),
    )
    if a.causal and len(t.tokens) > 1:
        doc.add(_sink(t, p))
    specials = list(dict.fromkeys(display_token(t.tokens[j]) for j in range(len(t.tokens)) if is_special(t, j)))
    looks = ["some look at the token before" + ("" if a.causal else " or after")]
    if a.causal:
        looks.append("some at the first token")
    elif specials:
        looks.append(f"some at {' and '.join(specials)}")
    # The model as it was given (a folder, a .bin file, a hub id), so the command runs as printed.
    model = "" if m.default_model else f"--model {shlex.quote(m.source)}"
    doc.add(
        Paragraph(
            f"Heads differ a lot: {', '.join(looks)}, some spread their weight widely. To see what all "
            f"{t.n_layers * t.n_heads} heads do on this sentence, run"
        ),
        Lines(command_lines(f"selfattn heads {_shell_quoted(m.sentence)}", model) if model
              else [f"selfattn heads {_shell_quoted(m.sentence)}"]),
        Paragraph(
            "then pick one and come back with --layer and --head. --format json has every number of this walkthrough."
        ),
    )
