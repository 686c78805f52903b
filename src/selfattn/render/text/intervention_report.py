"""``selfattn ablate`` and ``selfattn patch`` written out: tables, explanations and JSON.

Handed the records of ``analysis.ablation`` and ``analysis.interventions`` by
``commands.interventions``; nothing here runs the model.
"""

from __future__ import annotations

import shlex

from selfattn.render.text.command_output import command_lines, shown_tokens
from selfattn.render.text.document import Document, Heading, Lines, Paragraph, Table, display_token, fmt

CHANGED = 5  # tokens listed where the loss changed most
STRIPES = 8  # heads listed with their induction score before and after


def _chances(chances) -> list[dict]:
    return [{"token": c.token, "text": c.text, "id": c.id, "p": c.p} for c in chances]


def ablation_to_dict(model_name: str, text: str | None, probe, report) -> dict:
    """An ablation as plain data, for --format json (and for the text, which reads it).

    Returns:
        model, the text or the probe, heads ([layer, head] pairs), mode, loss {"before",
        "after"} (mean nats over the scored tokens), scored_tokens (how many), changed (the
        tokens whose loss changed most: position, token, before, after), top_before and
        top_after (the five most likely next tokens at the last position: token, text, id, p),
        probe_induction (on the probe: every head's induction score, {"before", "after"},
        layers x heads; null on a text).
    """
    source = {"text": text} if probe is None else {
        "probe": {"kind": probe.kind, "length": probe.length, "seed": probe.seed, "ids": probe.ids}}
    return {
        "model": model_name, **source,
        "heads": [[layer, head] for layer, head in report.heads], "mode": report.mode,
        "loss": {"before": report.loss_before, "after": report.loss_after},
        "scored_tokens": len(report.tokens),
        "changed": [{"position": t.position, "token": t.token, "before": t.before, "after": t.after}
                    for t in report.most_changed(CHANGED)],
        "top_before": _chances(report.top_before), "top_after": _chances(report.top_after),
        "probe_induction": None if report.probe_before is None else {
            "before": [[float(v) for v in row] for row in report.probe_before],
            "after": [[float(v) for v in row] for row in report.probe_after]},
    }


def ablation_document(data: dict, report, precision: int) -> Document:
    """The ablation as a Document: what was knocked out, the loss before and after, the tokens, the next token."""
    heads = ", ".join(f"layer {layer} head {head}" for layer, head in data["heads"]) or "no head"
    how = ("set to zero" if data["mode"] == "zero" else
           "replaced by its mean over the input's positions")
    doc = Document()
    probe = data.get("probe")
    if probe is None:
        doc.add(Paragraph(f"Text: {display_token(data['text'])}"))
        scored = f"every predicted token of the text ({data['scored_tokens']})"
    else:
        doc.add(Paragraph(f"Probe (induction): {probe['length']} random tokens (seed {probe['seed']}), then the same again."))
        scored = (f"the second copy from its second token on ({data['scored_tokens']} tokens), which only a model that "
                  "looks back at the first copy can predict")
    doc.add(
        Paragraph(f"{len(report.readable)} tokens: {shown_tokens(report.readable, ' | ')}"),
        Paragraph(
            f"Knocked out: {heads}, each {how} before the output projection, in every forward pass. The loss is "
            f"the mean next-token loss in nats over {scored}: -ln p(the token that came | the tokens before it)."),
        Heading("Loss"),
        Lines([
            f"with every head      {fmt(data['loss']['before'], precision)} nats",
            f"heads knocked out    {fmt(data['loss']['after'], precision)} nats",
            f"change               {data['loss']['after'] - data['loss']['before']:+.{precision}f} nats",
        ]),
        Heading("Where the loss changed most"),
        Table(["position", "token", "before", "after", "change"],
              [[str(t["position"]), display_token(t["token"]), fmt(t["before"], precision), fmt(t["after"], precision),
                f"{t['after'] - t['before']:+.{precision}f}"] for t in data["changed"]], numeric_from=2),
        Heading("The next token after the last, before and after"),
        Table(["rank", "with every head", "p", "heads knocked out", "p"],
              [[str(i + 1), display_token(b["text"]), fmt(b["p"], precision), display_token(a["text"]), fmt(a["p"], precision)]
               for i, (b, a) in enumerate(zip(data["top_before"], data["top_after"]))], numeric_from=2),
    )
    stripes = data.get("probe_induction")
    if stripes is not None:
        pairs = [(layer, head) for layer, row in enumerate(stripes["before"]) for head in range(len(row))]
        shown = sorted(pairs, key=lambda p: (-stripes["before"][p[0]][p[1]], p))[:STRIPES]
        doc.add(
            Heading("The induction heads' stripe, before and after"),
            Paragraph(
                "Each head's induction score on the probe: its mean weight from a token of the second copy to the "
                "token after that token's first copy (1 = a perfect induction head). An induction head finds that "
                "token through what a previous-token head wrote into it; knock the previous-token heads out and the "
                f"stripe fades. The {len(shown)} heads strongest before:"),
            Table(["layer", "head", "before", "after"],
                  [[str(layer), str(head), fmt(stripes["before"][layer][head], precision),
                    fmt(stripes["after"][layer][head], precision)] for layer, head in shown], numeric_from=2),
        )
    written = data.get("generated")
    if written is not None:
        how = ("the likeliest token each step" if written["temperature"] == 0
               else f"drawn at temperature {written['temperature']:g}, seed {written['seed']}")
        doc.add(
            Heading(f"The next {written['new_tokens']} tokens, before and after"),
            Paragraph(f"The input continued ({how}), with every head:"),
            Lines([written["before"]]),
            Paragraph("With the heads knocked out:"),
            Lines([written["after"]]),
        )
    return doc


def patching_to_dict(model, clean: str, corrupted: str, run) -> dict:
    """A patching run as plain data: recovered (layers x heads), the target and both log-probabilities."""
    tokenizer = model.tokenizer
    readable = (lambda ids: tokenizer.readable(ids)) if tokenizer is not None else (lambda ids: [f"<id {i}>" for i in ids])
    target = tokenizer.token(run.target) if tokenizer is not None else f"<id {run.target}>"
    return {
        "model": model.name, "clean": clean, "corrupted": corrupted,
        "clean_tokens": readable(run.clean), "corrupted_tokens": readable(run.corrupted),
        "target": {"token": target, "text": readable([run.target])[0], "id": run.target},
        "log_prob": {"clean": run.lp_clean, "corrupted": run.lp_corrupted},
        "positions": run.positions,
        "warning": run.warning,
        "recovered": [[float(v) for v in row] for row in run.recovered],
    }


def path_patching_to_dict(model, clean: str, corrupted: str, run) -> dict:
    """A path-patching run as plain data: the path, what it recovered, the heads a shared input also touched."""
    tokenizer = model.tokenizer
    target = tokenizer.token(run.target) if tokenizer is not None else f"<id {run.target}>"
    text = tokenizer.readable([run.target])[0] if tokenizer is not None else target
    return {
        "model": model.name, "clean": clean, "corrupted": corrupted,
        "target": {"token": target, "text": text, "id": run.target},
        "senders": [[l, h] for l, h in run.senders], "receivers": [[l, h] for l, h in run.receivers],
        "via": "".join(run.via), "positions": run.positions,
        "touched": [[l, h] for l, h in run.touched],
        "log_prob": {"clean": run.lp_clean, "corrupted": run.lp_corrupted, "patched": run.lp_patched},
        "warning": run.warning,
        "recovered": run.recovered,
    }


def _heads_list(pairs) -> str:
    return ", ".join(f"{l}.{h}" for l, h in pairs)


def path_patching_document(data: dict, precision: int) -> Document:
    """One path's recovered fraction, with what was sent where and how to read it."""
    target = display_token(data["target"]["text"])
    inputs = {"q": "queries", "k": "keys", "v": "values"}
    via = " and ".join(inputs[x] for x in data["via"])
    lp = data["log_prob"]
    doc = Document()
    if data["warning"]:
        doc.add(Paragraph(f"Warning: {data['warning']}."))
    doc.add(
        Paragraph(f"Target {target!r} after the last token: log-probability {fmt(lp['clean'], precision)} on the clean "
                  f"text, {fmt(lp['corrupted'], precision)} on the corrupted one, {fmt(lp['patched'], precision)} "
                  "with the path patched."),
        Paragraph(f"Path: the senders {_heads_list(data['senders'])} -> the {via} of the receivers "
                  f"{_heads_list(data['receivers'])}"
                  + ("" if data["positions"] is None else f", at positions {', '.join(map(str, data['positions']))}")
                  + "."),
        Paragraph(f"Recovered: {fmt(data['recovered'], precision)}"),
        Heading("How to read it"),
        Paragraph(
            "The corrupted text is run again with one change: the receivers read their "
            f"{via} from the stream of the corrupted run plus what the senders wrote on the clean run instead "
            "(less what they wrote on the corrupted one). Nothing else sees the senders' clean output: other "
            "heads, the MLPs and the embeddings stay as in the corrupted run. Everything after the receivers is "
            "computed again. The number is the share of the way back to the clean answer: 1, this path alone "
            "carries the difference; 0, none of it."),
    )
    if data["touched"]:
        doc.add(Paragraph(
            f"The receivers share their key/value heads with {_heads_list(data['touched'])}: replacing a key or "
            "value changes what those heads read too."))
    return doc


def patching_document(data: dict, precision: int, picture: str | None) -> Document:
    """The patching table with how to read it."""
    recovered = data["recovered"]
    n_heads = len(recovered[0])
    target = display_token(data["target"]["text"])
    doc = Document()
    if data.get("warning"):
        doc.add(Paragraph(f"Warning: {data['warning']}."))
    doc.add(
        Paragraph(f"Clean:     {shown_tokens(data['clean_tokens'], ' | ')}"),
        Paragraph(f"Corrupted: {shown_tokens(data['corrupted_tokens'], ' | ')}"),
        Paragraph(
            f"Target {target!r} after the last token: log-probability {fmt(data['log_prob']['clean'], precision)} on the "
            f"clean text, {fmt(data['log_prob']['corrupted'], precision)} on the corrupted one."),
        Heading("How to read the table"),
        Paragraph(
            "For each head alone, the corrupted text is run again with that head's output, at every position, "
            "taken from the clean run. The cell is the share of the way back to the clean answer: "
            "(lp_patched - lp_corrupted) / (lp_clean - lp_corrupted), where lp is the target's log-probability. "
            "1: this head alone carries the difference; 0: it carries none of it; below 0: patching it moves "
            "the answer further away. Layers and heads count from 0."),
        Table(["layer", *(f"head {h}" for h in range(n_heads))],
              [[str(layer), *(fmt(v, precision) for v in row)] for layer, row in enumerate(recovered)], numeric_from=1),
    )
    best = max(((v, layer, head) for layer, row in enumerate(recovered) for head, v in enumerate(row)))
    doc.add(Paragraph(f"Most recovered: layer {best[1]} head {best[2]} ({fmt(best[0], precision)})."))
    if picture is not None:
        doc.add(Paragraph(f"Heatmap written to {picture}."))
    else:
        quoted = f"{shlex.quote(data['clean'])} {shlex.quote(data['corrupted'])}"
        doc.add(Paragraph("The same as a heatmap:"))
        doc.add(Lines(command_lines("selfattn patch",
                                    f"{quoted} --model {shlex.quote(data['model'])} --target "
                                    f"{shlex.quote(data['target']['token'])} -o patch.png")))
    return doc


TOP_HEADS = 10  # heads listed by the size of their share


def attribution_to_dict(model, text: str, found) -> dict:
    """A direct logit attribution as plain data (for --format json, and for the text, which reads it).

    Returns:
        model, text, tokens, target {token, text, id}, position (from 0), heads
        [{layer, head, logit}] (every head, layer by layer), components [{name, logit}]
        (embeddings, biases, MLPs, in the order the stream adds them), total (the sum of
        every share) and logit (the model's own).
    """
    tokenizer = model.tokenizer
    readable = (lambda ids: tokenizer.readable(ids)) if tokenizer is not None else (lambda ids: [f"<id {i}>" for i in ids])
    token = tokenizer.token(found.target) if tokenizer is not None else f"<id {found.target}>"
    return {
        "model": model.name, "text": text, "tokens": readable(found.ids),
        "target": {"token": token, "text": readable([found.target])[0], "id": found.target},
        "position": found.position,
        "heads": [{"layer": layer, "head": head, "logit": float(v)}
                  for layer, row in enumerate(found.heads) for head, v in enumerate(row)],
        "components": [{"name": name, "logit": share} for name, share in found.components],
        "total": found.total, "logit": found.logit,
    }


def attribution_document(data: dict, precision: int, picture: str | None) -> Document:
    """The heads that write the target's logit most, every other part, and the sum against the logit."""
    tokens, position = data["tokens"], data["position"]
    target = display_token(data["target"]["text"])
    heads = sorted(data["heads"], key=lambda h: (-abs(h["logit"]), h["layer"], h["head"]))
    head_total = sum(h["logit"] for h in data["heads"])
    doc = Document()
    doc.add(
        Paragraph(f"Text: {shown_tokens(tokens, ' | ')}"),
        Paragraph(f"Target {target!r} after token {position} ({display_token(tokens[position])!r}): "
                  f"logit {fmt(data['logit'], precision)}."),
        Heading("How to read it"),
        Paragraph(
            "The residual stream at the last layer is a sum of what each part wrote: the embeddings, every "
            "head (its output through W_o), every MLP, the biases. With the final norm's scale held at the "
            "value it had in this run, each part's share of the target's logit is its vector through the norm "
            "and then the target's row of the unembedding; the shares add up to the logit. A large positive "
            "share is a part that pushes the target up; a negative one pushes it down. Layers and heads count "
            "from 0."),
        Heading(f"The heads with the largest shares (of {len(heads)})"),
        Table(["layer", "head", "share"],
              [[str(h["layer"]), str(h["head"]), fmt(h["logit"], precision)] for h in heads[:TOP_HEADS]], numeric_from=0),
        Heading("The other parts"),
        Table(["part", "share"], [[c["name"], fmt(c["logit"], precision)] for c in data["components"]], numeric_from=1),
        Paragraph(f"Every head together: {fmt(head_total, precision)}; the total of every share "
                  f"{fmt(data['total'], precision)}, the model's logit {fmt(data['logit'], precision)}."),
    )
    if picture is not None:
        doc.add(Paragraph(f"The heads' shares drawn to {picture}."))
    else:
        doc.add(Paragraph("Every head's share as a picture:"))
        doc.add(Lines(command_lines(
            "selfattn attribute", f"{shlex.quote(data['text'])} --model {shlex.quote(data['model'])} --target "
            f"{shlex.quote(data['target']['token'])} --position {position} -o attribution.png")))
    return doc
