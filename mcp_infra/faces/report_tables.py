"""The report's tables below the charts: verification and its key, gates, service impact and
cost, environment, every check. Each figure is bound to its source (``report_data.Sources``).
"""

from __future__ import annotations

from typing import Any

from mcp_infra.faces.report_data import NONE, Loaded, esc, pointer


def table(
    rows: list[list[str]], head: list[str], cls: str = "", row_classes: list[str] | None = None
) -> str:
    out = [f"<table{f' id={cls!r}' if cls else ''}><tr>"]
    out += [f"<th>{h}</th>" for h in head]
    out.append("</tr>")
    for i, row in enumerate(rows):
        klass = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        out.append(f"<tr{klass}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def verification_html(data: Loaded, verification: Any | None) -> str:
    if verification is None:
        return "<p class='warn'>Not verified: this page was rendered without a verification.</p>"
    src = data.src
    if not verification.failed:
        head = (
            "<p class='ok'>Evidence verified: every check passed or did not apply (signature, "
            "chain, hashes, every sample, verdict and gates recomputed; see Verification).</p>"
        )
    else:
        names = ", ".join(
            src.text(pointer("verification", "failed", i)) for i in range(len(verification.failed))
        )
        head = (
            f"<p class='failed'>Evidence does NOT verify: failed {names}. The figures below are "
            "what the bundle claims, not what it proves.</p>"
        )
    fp = pointer("verification", "key_fingerprint")
    if verification.key_fingerprint is None:
        key = f"<p class='warn'>{src.text(pointer('verification', 'key_note'))}</p>"
    else:
        pinned = pointer("verification", "pinned_fingerprint")
        if verification.key_trust == "home":
            trust = "<span class='ok'>this home's own key</span>"
        elif verification.key_trust == "pinned":
            trust = "<span class='ok'>the fingerprint pinned with --fingerprint</span>"
        elif verification.pinned_fingerprint:
            trust = (
                "<b>NOT the pinned key</b> (pinned: "
                f"{src.text(pinned, limit=16, code=True)}), so this bundle is not shown to be "
                "signed by the pinned key"
            )
        else:
            trust = (
                "<b>NOT this home's key and NOT pinned</b>: the signature shows only that "
                "whoever holds this key sealed these files, not who that is. Compare the "
                "fingerprint with one the bundle's owner published apart from the bundle, then "
                "pin it with --fingerprint"
            )
        klass = "muted" if verification.key_trust in ("home", "pinned") else "warn"
        key = (
            f"<p class='{klass}' id='key'>Signed with the key "
            f"{src.text(fp, limit=16, code=True)} (in full {src.text(fp, code=True)}: SHA-256 "
            f"of the raw Ed25519 public key), read from "
            f"{src.text(pointer('verification', 'key_path'), code=True)}: {trust}.</p>"
            f"<p class='muted'>Check it yourself: {verify_command_html(data, verification)}</p>"
        )
    return head + key


def verify_command_html(data: Loaded, verification: Any) -> str:
    src = data.src
    key = (
        f" --key {src.text(pointer('verification', 'key_path'))}"
        if verification.key_trust != "home" and verification.key_path
        else ""
    )
    return (
        f"<code class='mono'>mcp-infra evidence verify {src.text(pointer('bundle', 'path'))}"
        f"{key} --fingerprint {src.text(pointer('verification', 'key_fingerprint'))}</code>"
    )


def gates_html(data: Loaded) -> str:
    src, verdict = data.src, data.verdict
    if verdict is None:
        return "<p class='muted'>No verdict: selection did not run.</p>"
    parts = []
    for i, item in enumerate(verdict.candidates):
        at = pointer("verdict.json", "candidates", i)
        parts.append(
            f"<h3>{src.text(f'{at}/candidate', code=True)} — {src.text(f'{at}/decision')}</h3>"
        )
        parts.append(
            "<ul>"
            + "".join(
                f"<li>{src.text(f'{at}/reasons/{k}', limit=600)}</li>"
                for k in range(len(item.reasons))
            )
            + "</ul>"
        )
        rows = []
        for j, gate in enumerate(item.gates):
            g = f"{at}/gates/{j}"
            first = next((k for k, c in enumerate(gate.comparisons) if not c.identical), None)
            if first is None:
                divergence = "none (all identical)" if gate.comparisons else NONE
            else:
                c = f"{g}/comparisons/{first}"
                divergence = (
                    f"prompt {src.text(f'{c}/prompt_id', code=True)} at token "
                    f"{src.num(f'{c}/first_divergence', 'int')}: baseline "
                    f"{src.text(f'{c}/baseline_context', limit=80, code=True)} vs candidate "
                    f"{src.text(f'{c}/candidate_context', limit=80, code=True)}"
                )
            status = "ok" if gate.passed else "failed"
            rows.append(
                [
                    src.text(f"{g}/gate"),
                    f"<span class='{status}'>{'passed' if gate.passed else 'FAILED'}</span>",
                    src.text(f"{g}/detail", limit=300),
                    divergence,
                ]
            )
        parts.append(
            table(rows, ["gate", "result", "detail", "first token divergence"])
            if rows
            else "<p class='muted'>No gate ran (not measured).</p>"
        )
    return "".join(parts)


SI, CO = "service_impact.json#", "cost.json#"


def cost_html(data: Loaded) -> str:
    """Service impact and cost, with the one downtime figure, defined once: the seconds the
    stable port had no backend able to serve, as the front measured them; only a bundle without
    that measurement falls back to the journal's upper bound."""
    if data.impact is None and data.cost is None:
        return "<p class='muted'>This bundle has neither cost.json nor service_impact.json.</p>"
    rows = [_downtime(data), *_impact_rows(data), *_cost_rows(data)]
    out = table(rows, ["figure", "value"])
    if data.cost is not None and data.cost.servers:
        out += (
            "<details><summary>every server process of the cycle</summary>"
            + table(_server_rows(data), ["server", "role", "pid", "CPU", "peak memory", "note"])
            + "</details>"
        )
    return out


def _downtime(data: Loaded) -> list[str]:
    src, cost, impact = data.src, data.cost, data.impact
    if impact is not None and impact.unserved_s is not None:
        return [
            "<b>downtime</b>",
            f"<b>{src.num(f'{SI}/unserved_s', 's2')}</b> <span class='muted'>: seconds the "
            "stable port had no backend able to serve a request, measured by the front that "
            "owns the port</span>",
        ]
    if cost is not None and cost.downtime_s is not None:
        return [
            "<b>downtime</b>",
            f"<b>at most {src.num(f'{CO}/downtime_s', 's2')}</b> <span class='muted'>: "
            f"an upper bound from the journal ({src.text(f'{CO}/downtime_source')}); the "
            "front's own measurement is not in this bundle</span>",
        ]
    return ["<b>downtime</b>", "not recorded in this bundle"]


def _impact_rows(data: Loaded) -> list[list[str]]:
    src = data.src
    if data.impact is None:
        return []
    return [
        [
            "how candidates ran",
            f"{src.text(f'{SI}/mode')} <span class='muted'>("
            f"{src.text(f'{SI}/mode_reason')})</span>",
        ],
        [
            "requests the front held",
            f"{src.num(f'{SI}/requests_held', 'int')} (longest "
            f"{src.num(f'{SI}/longest_hold_s', 's2')})",
        ],
        ["answered HTTP 503 (unavailable)", src.num(f"{SI}/rejected_503", "int")],
        ["upstream errors", src.num(f"{SI}/upstream_errors", "int")],
        ["live requests served during the cycle", src.num(f"{SI}/live_requests", "int")],
    ]


def _cost_rows(data: Loaded) -> list[list[str]]:
    src, cost = data.src, data.cost
    if cost is None:
        return []
    phases = ", ".join(
        f"{esc(k)} {src.num(pointer('cost.json', 'phases_s', k), 's1')}" for k in cost.phases_s
    )
    energy = (
        src.num(f"{CO}/energy_j", "j1")
        if cost.energy_j is not None
        else src.text(f"{CO}/energy_note")
    )
    return [
        ["wall time", src.num(f"{CO}/wall_s", "s1")],
        ["per phase", phases],
        ["supervisor CPU", src.num(f"{CO}/supervisor_cpu_s", "s1")],
        [
            "bytes downloaded",
            f"{src.num(f'{CO}/bytes_downloaded', 'int')} <span class='muted'>"
            f"({src.text(f'{CO}/bytes_note')})</span>",
        ],
        ["energy", energy],
        ["cost against gain", src.text(f"{CO}/gain_note")],
    ]


def _server_rows(data: Loaded) -> list[list[str]]:
    src = data.src
    assert data.cost is not None
    return [
        [
            src.text(pointer("cost.json", "servers", k, "label"), code=True),
            src.text(pointer("cost.json", "servers", k, "role")),
            src.num(pointer("cost.json", "servers", k, "pid"), "int"),
            src.num(pointer("cost.json", "servers", k, "cpu_s"), "s1"),
            src.num(pointer("cost.json", "servers", k, "peak_rss_gb"), "gb"),
            src.text(pointer("cost.json", "servers", k, "note")),
        ]
        for k in range(len(data.cost.servers))
    ]


def env_html(data: Loaded) -> str:
    src, env = data.src, data.env
    if env is None:
        return "<p class='muted'>No environment.json.</p>"
    e = "environment.json"
    rows = [
        ["platform", src.text(pointer(e, "platform"))],
        ["machine / CPU", f"{src.text(pointer(e, 'machine'))} · {src.text(pointer(e, 'cpu'))}"],
        [
            "cores / memory",
            f"{src.num(pointer(e, 'cpu_count'), 'int')} · {src.num(pointer(e, 'memory_gb'), 'gb')}",
        ],
        [
            "accelerator / BLAS",
            f"{src.text(pointer(e, 'accelerator'))} · {src.text(pointer(e, 'blas'))}",
        ],
        ["python", src.text(pointer(e, "python"))],
        [
            "packages",
            ", ".join(
                f"{src.key(pointer(e, 'packages', k))} {src.text(pointer(e, 'packages', k))}"
                for k in env.packages
            ),
        ],
        [
            "models",
            "<br>".join(
                f"{src.key(pointer(e, 'models', k), code=True)} "
                f"{src.text(pointer(e, 'models', k), limit=40)}"
                for k in env.models
            ),
        ],
    ]
    return table(rows, ["", ""])


def checks_html(data: Loaded, verification: Any | None) -> str:
    if verification is None:
        return ""
    src = data.src
    rows = [
        [
            src.text(pointer("verification", "checks", k, "name")),
            f"<span class='{c.status}'>{src.text(pointer('verification', 'checks', k, 'status'))}"
            "</span>",
            src.text(pointer("verification", "checks", k, "detail")),
        ]
        for k, c in enumerate(verification.checks)
    ]
    word = "every check passed or did not apply" if not verification.failed else "FAILED"
    return f"<h2>Verification: {word}</h2>" + table(rows, ["check", "result", "detail"])
