// autopar plan explorer: plain JavaScript against the public API (no build step).
// Every request carries X-API-Key when one is set; the job's server-sent events are
// read with fetch() rather than EventSource, which cannot send headers.
"use strict";

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;
const KEY_STORAGE = "autopar.apiKey";
const SWEEP_POLL_MS = 1000;
const SWEEP_MAX_POLLS = 1800;

const $ = (id) => document.getElementById(id);
const graphCache = new Map();
let currentJob = null;
let currentAbort = null;
let reportUrl = null;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("api-key").value.trim();
  if (key) h["X-API-Key"] = key;
  return h;
}

async function problemText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status} ${body.code || ""}: ${body.detail || body.title || JSON.stringify(body)}`;
  } catch (err) {
    return `${resp.status} ${resp.statusText}`;
  }
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (!resp.ok) throw new Error(await problemText(resp));
  return { status: resp.status, data: await resp.json() };
}

function setStatus(text, cls) {
  const el = $("status");
  el.textContent = text;
  el.className = cls || "";
}

function ms(seconds) {
  return seconds === null || seconds === undefined ? "n/a" : `${(seconds * 1e3).toFixed(2)} ms`;
}

// "4.25 GiB", or "2.04 MiB" under 1 GiB (a tiny model's plan is not "0.00 GiB")
function size(n) {
  if (n === null || n === undefined) return "n/a";
  return n >= GIB ? `${(n / GIB).toFixed(2)} GiB` : `${(n / MIB).toFixed(2)} MiB`;
}

// ------------------------------------------------------------------ form

// The form's choices; on a server with API keys they come once a key is entered (a 401 says so).
async function loadOptions() {
  if ($("model").length) return;
  const { data } = await api("GET", "/v1/explorer/options");
  if ($("model").length) return;  // another call filled the form meanwhile
  const model = $("model");
  for (const name of data.models) model.add(new Option(name, name, name === "tiny-gpt", name === "tiny-gpt"));
  const preset = $("preset");
  for (const [name, spec] of Object.entries(data.presets)) {
    const gib = (spec.memory_bytes / GIB).toFixed(0);
    preset.add(new Option(`${name} (${gib} GiB)`, name, name === "a100-40g", name === "a100-40g"));
  }
}

async function graphJson() {
  const source = document.querySelector("input[name=source]:checked").value;
  if (source === "file") {
    const file = $("graph-file").files[0];
    if (!file) throw new Error("choose a graph JSON file to upload");
    try {
      return JSON.parse(await file.text());
    } catch (err) {
      throw new Error(`${file.name} is not JSON: ${err.message}`);
    }
  }
  const name = $("model").value;
  if (!graphCache.has(name)) {
    setStatus(`building the ${name} graph...`);
    graphCache.set(name, (await api("GET", `/v1/models/${encodeURIComponent(name)}/graph`)).data);
  }
  return graphCache.get(name);
}

function parseMesh(text) {
  const t = text.trim();
  if (!t || t === "search") return null;
  return t.split(/[,x ]+/).filter(Boolean).map((v) => parseInt(v, 10));
}

function parseBudget(text) {
  const t = String(text).trim();
  return t ? Math.round(parseFloat(t) * GIB) : null;
}

function commonFields() {
  const options = {};
  const limit = parseFloat($("time-limit").value);
  if (limit > 0) options.time_limit_s = limit;
  const k = parseInt($("micro-batches").value, 10);
  if (Number.isInteger(k)) options.micro_batches = k;  // a bad K is the server's 422, shown as is
  options.checkpointing = $("checkpointing").value;
  return { cluster: $("cluster").value.trim(), preset: $("preset").value, options };
}

// ------------------------------------------------------------------ one plan

// Until the solver reports its first plan the chart has no axes (empty axes read -1 to 4),
// only a line saying what it waits for; the first point brings the axes in.
let progressAxes = false;
const WAITING_TEXT = "the iteration time of the best plan and the proven bound appear here as the solver finds them";

// A pipeline's solver reports each stage's solve in turn (a stage's K micro-batches and its
// once-per-step work, not the pipeline's iteration): the chart says so.
function progressChart(stages) {
  progressAxes = false;
  const staged = stages !== undefined && stages !== "1";
  Plotly.newPlot(
    "progress-chart",
    [
      { x: [], y: [], name: "objective (best plan)", mode: "lines+markers", line: { shape: "hv" } },
      { x: [], y: [], name: "bound", mode: "lines+markers", line: { shape: "hv", dash: "dot" } },
    ],
    {
      title: { text: staged ? "Solver progress, stage by stage" : "Solver progress" },
      xaxis: { title: { text: "elapsed s" }, visible: false, rangemode: "tozero" },
      yaxis: {
        title: { text: staged ? "a stage's modelled iteration, ms" : "modelled iteration time, ms" },
        visible: false,
      },
      showlegend: false,
      annotations: [{ text: WAITING_TEXT, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }],
      height: 300,
      margin: { l: 60, r: 20, t: 40, b: 40 },
    },
    { displaylogo: false, responsive: true },
  );
}

function showProgress(job) {
  const parts = [`${job.status}`, job.phase || ""];
  if (job.elapsed_s !== null && job.elapsed_s !== undefined) parts.push(`${job.elapsed_s.toFixed(1)} s`);
  if (job.objective !== null && job.objective !== undefined) parts.push(`objective ${ms(job.objective)}`);
  if (job.bound !== null && job.bound !== undefined) parts.push(`bound ${ms(job.bound)}`);
  if (job.gap !== null && job.gap !== undefined) parts.push(`gap ${(100 * job.gap).toFixed(2)}%`);
  setStatus(parts.join(" · "), job.status);
  if (job.objective !== null && job.objective !== undefined) {
    const t = job.elapsed_s || 0;
    if (!progressAxes) {
      progressAxes = true;
      Plotly.relayout("progress-chart", {
        "xaxis.visible": true, "yaxis.visible": true, showlegend: true, annotations: [],
      });
    }
    Plotly.extendTraces(
      "progress-chart",
      { x: [[t], [t]], y: [[job.objective * 1e3], [job.bound === null ? null : job.bound * 1e3]] },
      [0, 1],
    );
  }
}

// Server-sent events over fetch: yields {event, data} until the stream ends.
async function* sseEvents(path, signal) {
  const resp = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!resp.ok) throw new Error(await problemText(resp));
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

async function followJob(job) {
  currentJob = job.id;
  currentAbort = new AbortController();
  $("cancel-button").disabled = false;
  let last = job;
  try {
    for await (const { event, data } of sseEvents(`/v1/jobs/${job.id}/events`, currentAbort.signal)) {
      if (event === "error") throw new Error(`${data.code}: ${data.detail}`);
      last = data;
      showProgress(data);
      if (event === "end") break;
    }
  } finally {
    $("cancel-button").disabled = true;
    currentJob = null;
  }
  return last;
}

// "iteration 246.00 ms (K = 8 micro-batches, checkpointing full)" of a plan record; of a
// pipeline "iteration 0.38 ms in 2 stages, bubble 40.4 % (K = 4 micro-batches, the slowest stage ...)"
function iterationLine(record) {
  const plan = record.plan || {};
  const predicted = plan.predicted || {};
  const k = plan.micro_batches || 1;
  const micro = record.micro_batch_time_s ?? predicted.micro_batch_time_s;
  const iteration = ms(record.iteration_time_s ?? predicted.iteration_time_s);
  const batches = `K = ${k} micro-batch${k === 1 ? "" : "es"}`;
  const checkpointing = `checkpointing ${plan.checkpointing || "off"}`;
  if (record.num_stages) {
    const bubble = record.bubble_fraction ?? predicted.bubble_fraction;
    return `iteration ${iteration} in ${record.num_stages} stages, bubble ${percent(bubble)} ` +
      `(${batches}, the slowest stage ${ms(micro)} per micro-batch, ${checkpointing})`;
  }
  return `iteration ${iteration} (${batches} of ${ms(micro)} each, ${checkpointing})`;
}

function percent(fraction) {
  return fraction === null || fraction === undefined ? "n/a" : `${(100 * fraction).toFixed(1)} %`;
}

// DOM building: every value the page shows from the server is written as text, never parsed as
// HTML (a plan's or a job's strings are the service's, but an error may quote a client's input).
function el(tag, content, attrs) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.dataset[name.slice(5)] = value;
    else node.setAttribute(name, value);
  }
  for (const part of [].concat(content ?? [])) {
    node.append(part instanceof Node ? part : document.createTextNode(String(part ?? "")));
  }
  return node;
}

// A table's rows from cells (text, or nodes); the first row is the header.
function fillTable(table, header, rows) {
  table.replaceChildren(el("tr", header.map((h) => el("th", h))), ...rows.map((cells) => el("tr", cells)));
}

// The stages of a pipeline plan (record.stages): blocks, devices, mesh, time and memory per stage.
function showStages(record) {
  const rows = record.stages || (record.plan && record.plan.format === "autopar.pipeline/v1"
    ? (record.plan.predicted || {}).stages : null);
  const headline = $("pipeline-headline");
  const table = $("stages-table");
  if (!rows || !rows.length) {
    headline.hidden = true;
    table.hidden = true;
    table.replaceChildren();
    return;
  }
  headline.textContent = `${rows.length} pipeline stages (1F1B): ` +
    `iteration ${ms(record.iteration_time_s)}, bubble ${percent(record.bubble_fraction)}, ` +
    `${size(record.memory_per_device_bytes)} per device on the largest stage`;
  headline.hidden = false;
  const body = rows.map((r) => {
    const blocks = r.first_block === r.last_block ? r.first_block : `${r.first_block}–${r.last_block}`;
    return [
      el("td", r.stage), el("td", [`${r.blocks}: `, el("code", blocks)], { class: "blocks" }),
      el("td", r.devices), el("td", `[${(r.mesh_shape || []).join(", ")}]`),
      el("td", ms(r.micro_batch_time_s)), el("td", ms(r.receive_time_s)),
      el("td", size(r.memory_per_device_bytes)), el("td", r.in_flight),
    ];
  });
  fillTable(table, ["stage", "blocks", "devices", "mesh", "ms / micro-batch", "receives",
    "memory / device", "micro-batches in flight"], body);
  table.hidden = false;
}

// the rows of --stages auto (diagnostics.stage_search): each number of stages with its
// iteration, bubble, memory and gap, or why it has no plan (proved worse, no time, an error)
function showStageSearch(record) {
  const rows = ((record.plan || {}).diagnostics || {}).stage_search;
  const headline = $("stage-search-headline");
  const table = $("stage-search-table");
  if (!rows || !rows.length) {
    headline.hidden = true;
    table.hidden = true;
    table.replaceChildren();
    return;
  }
  const body = rows.map((r) => {
    const solved = r.iteration_time_s !== undefined;
    const why = solved ? "" : (r.error || r.outcome || "no plan");
    const bound = r.stage_count_bound_s !== undefined ? ms(r.stage_count_bound_s) : "";
    return [
      el("td", r.stages), el("td", r.outcome || (solved ? "solved" : "no plan")),
      el("td", solved ? ms(r.iteration_time_s) : ""),
      el("td", r.bubble_fraction !== undefined ? percent(r.bubble_fraction) : ""),
      el("td", solved ? size(r.memory_per_device_bytes) : ""),
      el("td", r.gap !== undefined && r.gap !== null ? percent(r.gap) : ""),
      el("td", bound), el("td", `${(r.wall_s || 0).toFixed(1)} s`), el("td", why),
    ];
  });
  fillTable(table, ["stages", "outcome", "iteration", "bubble", "memory / device", "gap",
    "bound over every cut", "time", "why"], body);
  headline.hidden = false;
  table.hidden = false;
}

function showRecord(record) {
  showStages(record);
  showStageSearch(record);
  $("summary").textContent = `${iterationLine(record)}\n${record.summary || ""}\nplan ${record.key}`;
  const link = `/v1/plans/${record.key}/report?compare=megatron&compare=inferred`;
  $("report-tab").href = link;
  $("report-button").dataset.href = link;
  $("report-links").hidden = false;
}

async function submitPlan(ev) {
  ev.preventDefault();
  $("plan-button").disabled = true;
  $("report-links").hidden = true;
  $("summary").textContent = "";
  showStages({});
  showStageSearch({});
  progressChart($("stages").value);
  try {
    const body = Object.assign(commonFields(), {
      graph: await graphJson(),
      mesh_shape: parseMesh($("mesh").value),
      memory_budget_bytes: parseBudget($("budget").value),
      zero_stage: parseInt($("zero").value, 10),
    });
    const stages = $("stages").value;
    body.options.stages = stages === "auto" ? "auto" : parseInt(stages, 10);
    setStatus("submitting...");
    const { status, data } = await api("POST", "/v1/plans", body);
    if (status === 200) {
      setStatus(`cached plan · ${iterationLine(data)}`, "succeeded");
      showRecord(data);
      return;
    }
    const final = await followJob(data);
    if (final.status === "succeeded") {
      const record = (await api("GET", `/v1/plans/${final.id}`)).data;
      setStatus(`succeeded · ${iterationLine(record)} · ` +
        `${size(record.memory_per_device_bytes)} per device`, "succeeded");
      showRecord(record);
    } else {
      const err = final.error || {};
      setStatus(`${final.status}: ${err.message || err.code || "no detail"}`, "failed");
    }
  } catch (err) {
    if (err.name !== "AbortError") setStatus(err.message, "failed");
  } finally {
    $("plan-button").disabled = false;
  }
}

async function cancelJob() {
  if (!currentJob) return;
  try {
    await api("DELETE", `/v1/jobs/${currentJob}`);
  } catch (err) {
    setStatus(err.message, "failed");
  }
}

async function showReport() {
  const href = $("report-button").dataset.href;
  $("report-button").disabled = true;
  setStatus("rendering the report...", "succeeded");
  try {
    const resp = await fetch(href, { headers: headers() });
    if (!resp.ok) throw new Error(await problemText(resp));
    const blob = await resp.blob();
    if (reportUrl) URL.revokeObjectURL(reportUrl);
    reportUrl = URL.createObjectURL(new Blob([blob], { type: "text/html" }));
    $("report-frame").src = reportUrl;
    $("report-section").hidden = false;
    setStatus("report ready", "succeeded");
    $("report-section").scrollIntoView();
  } catch (err) {
    setStatus(err.message, "failed");
  } finally {
    $("report-button").disabled = false;
  }
}

// ------------------------------------------------------------------ sweep

function paretoFront(points) {
  // points with no other point at most as large in both memory and iteration time (one strictly smaller)
  const sorted = [...points].sort((a, b) => a.mem - b.mem || a.step - b.step);
  const front = [];
  let best = Infinity;
  for (const p of sorted) {
    const last = front[front.length - 1];
    if (p.step < best || (last && p.step === last.step && p.mem === last.mem)) {
      front.push(p);  // equal points are all on the front
      best = p.step;
    }
  }
  return front;
}

function rowLabel(r) {
  const mesh = r.chosen_mesh_shape || r.mesh_shape;
  const budget = r.memory_budget_bytes ? `${(r.memory_budget_bytes / GIB).toFixed(1)} GiB` : "device";
  return `mesh ${mesh ? mesh.join("x") : "search"} · ZeRO-${r.zero_stage} · budget ${budget}`;
}

function drawSweep(view) {
  // the iteration (K micro-batches + once-per-step work); rows of older plans have only the step
  const iter = (r) => (r.iteration_time_s === null || r.iteration_time_s === undefined ? r.step_time_s : r.iteration_time_s);
  const done = view.rows.filter((r) => r.status === "succeeded" && iter(r) !== null);
  // GiB, or MiB when every plan is under 1 GiB (small models)
  const [unit, scale] = done.some((r) => r.memory_per_device_bytes >= GIB) ? ["GiB", GIB] : ["MiB", MIB];
  const points = done.map((r) => ({
    mem: r.memory_per_device_bytes / scale,
    step: iter(r) * 1e3,
    label: rowLabel(r),
  }));
  const front = paretoFront(points);
  Plotly.react(
    "sweep-chart",
    [
      {
        x: points.map((p) => p.mem), y: points.map((p) => p.step), text: points.map((p) => p.label),
        mode: "markers", name: "plans", marker: { size: 10, color: "#1f77b4" },
        hovertemplate: `%{text}<br>%{x:.2f} ${unit}, %{y:.2f} ms<extra></extra>`,
      },
      {
        x: front.map((p) => p.mem), y: front.map((p) => p.step), text: front.map((p) => p.label),
        mode: "lines+markers", name: "Pareto front",
        marker: { size: 14, symbol: "star", color: "#d62728" }, line: { dash: "dot", color: "#d62728" },
        hovertemplate: `%{text}<br>%{x:.2f} ${unit}, %{y:.2f} ms<extra>Pareto</extra>`,
      },
    ],
    {
      title: { text: "Iteration time vs memory per device" },
      xaxis: { title: { text: `memory per device, ${unit}` } },
      yaxis: { title: { text: "modelled iteration time, ms" } },
      height: 360,
      margin: { l: 60, r: 20, t: 40, b: 40 },
    },
    { displaylogo: false, responsive: true },
  );
  const onFront = new Set(front.map((p) => p.label));
  const rows = view.rows.map((r) => {
    const pareto = onFront.has(rowLabel(r));
    const mem = r.memory_per_device_bytes === null ? "" : (r.memory_per_device_bytes / scale).toFixed(2);
    const iteration = r.iteration_time_s === null || r.iteration_time_s === undefined ? "" : ms(r.iteration_time_s);
    return [
      el("td", rowLabel(r)), el("td", `${r.status}${r.error ? ": " + r.error : ""}`),
      el("td", r.micro_batches ?? 1), el("td", r.checkpointing ?? "off"), el("td", iteration),
      el("td", mem), el("td", pareto ? "yes" : "", { class: pareto ? "pareto" : "" }),
      el("td", sweepLinks(r), { class: "links" }),
    ];
  });
  fillTable($("sweep-table"), ["point", "status", "K", "checkpointing",
    "iteration (K micro-batches + once per step)", `${unit} / device`, "Pareto", "plan"], rows);
}

// A solved point opens its plan (summary, as a solve shows it) or its report here.
function sweepLinks(r) {
  if (r.status !== "succeeded" || !r.key) return [];
  const link = (what) => el("button", what, { type: "button", class: "link", "data-key": r.key, "data-open": what });
  return [link("plan"), " ", link("report")];
}

async function openSweepPoint(ev) {
  const target = ev.target.closest("button[data-key]");
  if (!target) return;
  try {
    const record = (await api("GET", `/v1/plans/${encodeURIComponent(target.dataset.key)}`)).data;
    showRecord(record);
    setStatus(`sweep point · ${iterationLine(record)}`, "succeeded");
    if (target.dataset.open === "report") await showReport();
    else $("progress-section").scrollIntoView();
  } catch (err) {
    setStatus(err.message, "failed");
  }
}

async function submitSweep(ev) {
  ev.preventDefault();
  $("sweep-button").disabled = true;
  try {
    const meshes = $("sweep-meshes").value.split(";").map((m) => parseMesh(m));
    const budgetText = $("sweep-budgets").value.trim();
    const budgets = budgetText ? budgetText.split(",").map((b) => parseBudget(b)) : [null];
    const zeros = $("sweep-zero").value.split(",").map((z) => parseInt(z, 10)).filter((z) => z >= 0);
    const body = Object.assign(commonFields(), {
      graph: await graphJson(),
      mesh_shapes: meshes,
      memory_budgets_bytes: budgets,
      zero_stages: zeros.length ? zeros : [2],
    });
    $("sweep-status").textContent = "submitting...";
    let { data } = await api("POST", "/v1/sweeps", body);
    for (let i = 0; i < SWEEP_MAX_POLLS; i++) {
      const done = data.rows.filter((r) => !["queued", "running"].includes(r.status)).length;
      $("sweep-status").textContent = `${done} of ${data.rows.length} points done` +
        (data.complete ? "" : " (solving...)");
      drawSweep(data);
      if (data.complete) break;
      await new Promise((resolve) => setTimeout(resolve, SWEEP_POLL_MS));
      data = (await api("GET", `/v1/sweeps/${data.id}`)).data;
    }
  } catch (err) {
    $("sweep-status").textContent = err.message;
  } finally {
    $("sweep-button").disabled = false;
  }
}

// ------------------------------------------------------------------ start

function optionsError(err) {
  const hint = err.message.startsWith("401") ? " Enter the server's API key above." : "";
  return `cannot load the form's choices: ${err.message}.${hint}`;
}

document.addEventListener("DOMContentLoaded", () => {
  const key = $("api-key");
  key.value = localStorage.getItem(KEY_STORAGE) || "";
  key.addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, key.value.trim());
    if (!$("model").length) {
      loadOptions().then(() => setStatus("idle"), (err) => setStatus(optionsError(err), "failed"));
    }
  });
  $("plan-form").addEventListener("submit", submitPlan);
  $("sweep-form").addEventListener("submit", submitSweep);
  $("cancel-button").addEventListener("click", cancelJob);
  $("report-button").addEventListener("click", showReport);
  $("sweep-table").addEventListener("click", openSweepPoint);
  progressChart();
  loadOptions().catch((err) => setStatus(optionsError(err), "failed"));
});
