"""The dashboard page: one self-contained HTML document (inline CSS and JavaScript, no framework, nothing fetched
from outside), which polls `/api/state` every 2 s and renders the worker or the validator view by its `role`.

All text from the snapshot goes through `textContent`, never `innerHTML`: reasons and details can carry what a
worker wrote into a file.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>prime-node dashboard</title>
<style>
  :root { --bg: #f6f7f9; --card: #fff; --ink: #1d232b; --muted: #667085; --line: #e3e6ea;
          --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; --info: #0969da; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg);
         color: var(--ink); }
  header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 16px; padding: 14px 20px;
           background: var(--ink); color: #fff; }
  header h1 { margin: 0; font-size: 18px; }
  header .sub { color: #c9d1d9; font-family: ui-monospace, monospace; font-size: 13px; }
  #live { margin-left: auto; font-size: 13px; }
  #live.stale { color: #ffb4b4; }
  main { padding: 16px 20px; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(290px, 1fr)); gap: 12px; }
  .card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
  .card h2 { margin: 0 0 8px; font-size: 13px; text-transform: uppercase; letter-spacing: .04em;
             color: var(--muted); }
  dl { display: grid; grid-template-columns: max-content 1fr; gap: 3px 12px; margin: 0; }
  dt { color: var(--muted); }
  dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
  .note { color: var(--muted); font-size: 12px; }
  section { margin-top: 16px; }
  section h2 { font-size: 15px; margin: 0 0 8px; }
  table { width: 100%; border-collapse: collapse; background: var(--card); border: 1px solid var(--line); }
  th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { font-size: 12px; color: var(--muted); font-weight: 600; background: #fafbfc; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .mono { font-family: ui-monospace, monospace; font-size: 12.5px; }
  .badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
           border: 1px solid currentColor; margin-right: 6px; }
  .tone-ok { color: var(--ok); } .tone-warn { color: var(--warn); } .tone-bad { color: var(--bad); }
  .tone-info { color: var(--info); } .tone-muted { color: var(--muted); }
  #error { display: none; margin: 0 0 12px; padding: 8px 12px; border-radius: 6px; background: #ffebe9;
           color: var(--bad); border: 1px solid #ffcecb; }
</style>
</head>
<body>
<header><h1 id="title">prime-node</h1><span class="sub" id="subtitle">loading…</span>
<span id="live">connecting…</span></header>
<main>
<div id="error"></div>
<div id="view"></div>
</main>
<script>
"use strict";
const POLL_MS = 2000;
const NONE = "\\u2013";  // an en dash: no value
const TONES = { pending: "warn", claimable: "info", claimed: "ok", invalidated: "bad", refused: "warn",
  expired: "muted", written: "muted", uploaded: "muted", submitted: "info", accepted: "ok", rejected: "bad",
  seen: "muted", verified: "info", attested: "ok", unavailable: "bad", unverifiable: "muted",
  "ejected by its owner": "warn",
  member: "ok", ejected: "bad", running: "ok", stopping: "warn", void: "bad", held: "warn", releasable: "info",
  none: "muted" };

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const dash = (value) => (value === null || value === undefined || value === "" ? NONE : value);
const badge = (text, tone) => el("span", { class: "badge tone-" + (tone || TONES[text] || "muted") }, text);
const short = (hex) => (hex ? hex.slice(0, 14) + "…" : NONE);
function utc(unix) {
  if (unix === null || unix === undefined) return NONE;
  return new Date(unix * 1000).toISOString().replace("T", " ").replace(/\\.\\d+Z$/, " UTC");
}
function span(seconds) {
  let s = Math.max(0, Math.round(Math.abs(seconds)));
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (s >= size || (unit === "s" && !parts.length)) { parts.push(Math.floor(s / size) + unit); s %= size; }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}
function card(title, rows, note, id) {
  const dl = el("dl");
  for (const [label, value, rowId] of rows) dl.append(el("dt", {}, label), el("dd", { id: rowId }, dash(value)));
  return el("div", { class: "card", id }, el("h2", {}, title), dl, note ? el("div", { class: "note" }, note) : null);
}
function table(columns, rows, empty) {
  const head = el("tr", {}, columns.map(([name, cls]) => el("th", { class: cls }, name)));
  const body = rows.length ? rows : [el("tr", {}, el("td", { colspan: columns.length, class: "note" }, empty))];
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}
function tokens(value, what) { return value === null || value === undefined ? NONE : value + " " + (what || "tokens"); }

// --- worker -------------------------------------------------------------------------------------------------
function fileState(f, chainTime) {
  const parts = [badge(f.state)];
  if (f.state === "pending" && f.closes_at !== null) {
    parts.push("pending until " + utc(f.closes_at));
    if (chainTime) parts.push(el("span", { class: "note" }, " (in " + span(f.closes_at - chainTime) + ")"));
  } else if (f.state === "claimable") {
    parts.push("challenge window closed " + utc(f.closes_at) + "; claimable");
  } else if (f.state === "invalidated") {
    parts.push("invalidated: " + dash(f.reason) + (f.slashed ? "; slashed " + f.slashed + " tokens (burned)" : ""));
  } else if (f.state === "refused") {
    parts.push("refused: never paid, not slashed: " + dash(f.reason));
    if (f.closes_at !== null && chainTime && chainTime < f.closes_at) {
      parts.push(el("span", { class: "note" }, " (may still be invalidated until " + utc(f.closes_at) + ")"));
    }
  } else if (f.state === "void") {
    parts.push("void: never paid, the node was ejected from the pool");
    if (f.closes_at !== null && chainTime && chainTime < f.closes_at) {
      parts.push(el("span", { class: "note" }, " (may still be invalidated until " + utc(f.closes_at) + ")"));
    }
  } else if (f.state === "expired") {
    parts.push("never submitted: " + dash(f.reason));
  } else if (f.state === "claimed") {
    parts.push("reward claimed");
  } else if (f.state === "submitted") {
    parts.push("submitted; window not read from the chain yet");
  } else {
    parts.push(f.state === "written" ? "not uploaded yet" : f.batch ? "uploaded; its batch is being submitted" :
      "uploaded; waiting for a submit batch");
  }
  return el("td", { class: "state state-" + f.state }, parts);
}

function lockRelease(lock, chainTime, poolId) {
  if (!lock) return null;
  if (lock.state === "member") return [badge("member"), "held while a member, then one challenge window"];
  if (lock.state === "held") {
    return [badge("held"), "until " + utc(lock.release_at),
      chainTime ? el("span", { class: "note" }, " (in " + span(lock.release_at - chainTime) + ")") : null];
  }
  if (lock.state === "releasable") {
    return [badge("releasable"), "since " + utc(lock.release_at) + ": prime-node release " + poolId];
  }
  return [badge("none"), "no lock in this pool"];
}

function renderWorker(d) {
  const stake = d.stake || {}, tok = d.tokens || {}, pool = d.pool || {}, tp = d.throughput, chain = d.chain;
  const lock = d.lock;
  document.getElementById("title").textContent = "prime-node worker";
  document.getElementById("subtitle").textContent = d.node + " · pool " + d.pool_id + (pool.name ? " " +
    JSON.stringify(pool.name) : "");
  const counts = Object.entries(d.counts).filter(([, n]) => n).map(([s, n]) => n + " " + s).join(", ");
  const batches = Object.entries(d.batch_counts || {}).filter(([, n]) => n);
  const batchTotal = batches.reduce((sum, [, n]) => sum + n, 0);
  const batchCounts = batches.map(([s, n]) => n + " " + s).join(", ");
  const cards = el("div", { class: "grid" },
    card("Node", [
      ["node", el("span", { class: "mono" }, d.node)],
      ["provider", d.provider ? el("span", { class: "mono" }, d.provider) : null],
      ["pool", d.pool_id + (pool.name ? " (" + pool.name + ")" : "")],
      ["standing", badge(d.standing, TONES[d.standing] || "warn"), "standing"],
      ["daemon", [badge(d.daemon), "since " + utc(d.started_at)], "daemon"],
    ]),
    card("Work", [
      ["policy step held", d.step, "step"],
      ["newest file's step", d.newest_file_step],
      ["files / min", tp.files_per_min.toFixed(2), "files-per-min"],
      ["output tokens / s", tp.tokens_per_s.toFixed(1), "tokens-per-s"],
      ["files", d.files_total + (counts ? " (" + counts + ")" : "")],
      ["batches", batchTotal + (batchCounts ? " (" + batchCounts + ")" : ""), "batches"],
    ], "Throughput is an estimate: " + tp.files + " files, " + tp.units + " units over the last " +
       span(tp.window_s) + " (units = output tokens)."),
    card("Stake (provider's)", [
      ["active", tokens(stake.active), "stake-active"],
      ["locked by this node here", tokens(stake.node_locked), "stake-node-locked"],
      ["lock release", lockRelease(lock, chain.time, d.pool_id), "lock-release"],
      ["min stake per node", tokens(pool.min_stake_per_node)],
      ["locked, all pools", tokens(stake.locked)],
      ["free", tokens(stake.free)],
      ["unbonding", tokens(stake.unbonding) + (stake.release_at ? " until " + utc(stake.release_at) : "")],
    ], d.stake ? "From NodeRegistry.stakeOf / lockedOf / lockOf. A slash reaches only this node's lock in this " +
       "pool, and burns it; after leaving or an ejection the lock is held one challenge window longer." :
       "No provider stake read yet.", "stake"),
    card("Tokens", [
      ["earned (claimed)", tokens(tok.claimed), "earned"],
      ["claimable now", tokens(tok.claimable), "claimable"],
      ["at risk: pending rewards", tokens(tok.pending_rewards), "pending-rewards"],
      ["at risk: slash exposure", tokens(tok.slash_exposure), "slash-exposure"],
      ["void (node ejected)", tokens(tok.void_rewards) + (tok.void_files ? " (" + tok.void_files + " files)" : ""),
       "void-rewards"],
      ["refused (borderline)", tokens(tok.refused_rewards) + (tok.refused_files ? " (" + tok.refused_files +
       " files)" : ""), "refused-rewards"],
      ["lost rewards", tokens(tok.lost_rewards)],
      ["slashed (burned)", tokens(tok.slashed), "slashed"],
    ], "Estimates: rewards are units x reward per unit (" + dash(pool.reward_per_unit) + "), paid only if no " +
       "validator invalidates the file's batch in its window; slash exposure is an upper bound, " +
       dash(tok.exposed_batches) + " batches in their window x " + dash(pool.slash_amount) + " tokens, capped by " +
       "this node's lock in the pool. One bad file voids its whole batch. " +
       "A node ejected by an invalidation has its pending work void: never paid (an owner's ejection voids " +
       "nothing). A refused file is neither paid nor slashed. This node's journal only."),
    card("Chain", [
      ["block", chain.block],
      ["chain time", utc(chain.time)],
      ["read", chain.age_s === null ? "not yet" : span(chain.age_s) + " ago"],
      ["challenge window", pool.challenge_window_s === undefined ? null : span(pool.challenge_window_s)],
      ["read error", chain.error ? el("span", { class: "tone-bad" }, chain.error) : "none"],
    ]),
  );
  const rows = d.files.map((f) => el("tr", { "data-work-key": f.work_key },
    el("td", { class: "mono", title: f.work_key }, short(f.work_key)),
    el("td", { class: "num" }, f.step),
    el("td", { class: "num" }, f.units),
    fileState(f, chain.time),
    el("td", { class: "num" }, f.reward === null ? NONE : f.reward),
    el("td", { class: "mono", title: f.batch || "" }, f.batch ? [short(f.batch), el("span", { class: "note" },
      " leaf " + f.leaf_index)] : NONE),
    el("td", { class: "mono", title: f.tx || "" }, short(f.tx)),
    el("td", {}, dash(f.verdict)),
  ));
  const shown = d.files.length < d.files_total ? " (newest " + d.files.length + " of " + d.files_total + ")" : "";
  return [cards, el("section", {}, el("h2", {}, "Files" + shown), table(
    [["work key"], ["step", "num"], ["units", "num"], ["challenge-window state"], ["reward (est.)", "num"],
     ["batch"], ["submit tx"], ["validators attested"]], rows, "No files yet."))];
}

// --- validator ----------------------------------------------------------------------------------------------
function verdictCell(f) {
  if (f.accepted === null) return el("td", {}, f.last_error ? el("span", { class: "note" }, "retrying: " +
    f.last_error) : NONE);
  if (f.accepted) return el("td", { class: "verdict" }, badge("accepted"));
  return el("td", { class: "verdict" }, badge("rejected"), dash(f.reason_label) + (f.check ? " at " + f.check : ""),
    f.detail ? el("div", { class: "note" }, f.detail) : null);
}

function renderValidator(d) {
  document.getElementById("title").textContent = "prime-node validator";
  document.getElementById("subtitle").textContent = d.validator + " · pool " + d.pool_id;
  const c = d.counts;
  const cards = el("div", { class: "grid" },
    card("Validator", [
      ["address", el("span", { class: "mono" }, d.validator)],
      ["pool", d.pool_id],
      ["daemon", [badge(d.daemon), "since " + utc(d.started_at)], "daemon"],
    ]),
    card("Progress", [
      ["cursor block", d.cursor_block, "cursor-block"],
      ["chain head", d.head_block],
      ["blocks behind", d.blocks_behind],
      ["backlog", d.backlog + " files", "backlog"],
    ], "Backlog: submissions still to verify, attest or act on."),
    card("Verdicts", [
      ["files seen", d.seen, "seen"],
      ["with a verdict", d.verified, "verified"],
      ["accepted", d.accepted, "accepted"],
      ["rejected", d.rejected, "rejected"],
      ["unverifiable", c.unverifiable],
      ["invalidations sent", d.invalidations_sent, "invalidations-sent"],
      ["refusals sent", d.refusals_sent, "refusals-sent"],
    ], "Unverifiable: the checkpoint of the file's step is gone; never slashed. Refused: a borderline rejection, " +
       "refused on chain (refuseLeaf): not paid, not slashed."),
  );
  const reasons = d.rejections_by_reason.map((r) => el("tr", {}, el("td", {}, r.reason), el("td", { class: "num" },
    r.count)));
  const rows = d.files.map((f) => el("tr", { "data-work-key": f.work_key },
    el("td", { class: "mono", title: f.work_key }, short(f.work_key)),
    el("td", { class: "mono" }, f.node),
    el("td", { class: "num" }, f.block),
    el("td", { class: "num" }, f.units),
    el("td", {}, badge(f.stage)),
    verdictCell(f),
    el("td", { class: "mono", title: f.tx || "" }, f.tx ? short(f.tx) : dash(f.note)),
  ));
  const shown = d.files.length < d.seen ? " (newest " + d.files.length + " of " + d.seen + ")" : "";
  return [cards,
    el("section", {}, el("h2", {}, "Rejections by reason"), table([["reason"], ["files", "num"]], reasons,
      "No rejections.")),
    el("section", {}, el("h2", {}, "Files" + shown), table([["work key"], ["node"], ["block", "num"],
      ["units", "num"], ["stage"], ["verdict"], ["invalidation"]], rows, "No submissions seen yet."))];
}

// --- polling ------------------------------------------------------------------------------------------------
let lastOk = null;
async function poll() {
  const live = document.getElementById("live"), error = document.getElementById("error");
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || "HTTP " + response.status);
    const view = data.role === "validator" ? renderValidator(data) : renderWorker(data);
    document.getElementById("view").replaceChildren(...view);
    lastOk = Date.now();
    live.textContent = "updated " + utc(data.generated_at);
    live.className = "";
    error.style.display = "none";
  } catch (exc) {
    live.textContent = lastOk ? "not updated for " + span((Date.now() - lastOk) / 1000) : "no data";
    live.className = "stale";
    error.textContent = "Could not refresh: " + exc.message;
    error.style.display = "block";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}
poll();
</script>
</body>
</html>
"""
