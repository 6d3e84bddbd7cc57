// sedsynth view: the page. Plain JavaScript, no library: three views behind the URL's hash.
//   #/?split=&label=&...&page=     the dataset's mixtures, filtered and paged
//   #/mix/ID?t=&eval=&model=       one mixture: player, spectrogram, a lane per phrase, queries, stored scores
//   #/upload/TOKEN                 an uploaded file, as a mixture without labels
//   #/detect                       upload a file to query
//   #/evaluation?model=            the evaluation's figures, per-class table, worst false alarms and misses
// Every text from the data goes into the page as text (textContent), never as markup.
"use strict";

const state = { info: null, clip: null, frame: null, resize: null, listTicket: 0 };

// ---------- helpers ----------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options) {
  const response = await fetch("api/" + path, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const text = q.toString();
  return text ? "?" + text : "";
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search] = hash.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: Object.fromEntries(new URLSearchParams(search || "")) };
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(digits)) : String(x);
}

function seconds(x) { return fmt(x, 2) + " s"; }

function status(text) { document.getElementById("status").textContent = text || ""; }

function stopClip() {
  if (state.frame) cancelAnimationFrame(state.frame);
  if (state.resize) window.removeEventListener("resize", state.resize);
  state.frame = null; state.resize = null; state.clip = null;
}

function setNav(name) {
  for (const id of ["dataset", "detect", "evaluation"]) document.getElementById("nav-" + id).classList.toggle("active", id === name);
}

// ---------- dataset list ----------

const FILTERS = ["split", "label", "cluster", "min_events", "max_events", "min_snr", "max_snr", "text"];

function listForm(params) {
  const d = state.info.dataset;
  const option = (value, label, selected) => el("option", { value, selected: selected ? true : null, text: label });
  const select = (name, title, options) => el("label", {}, title, el("select", { name, id: "filter-" + name }, options));
  const number = (name, title, step) => el("label", {}, title, el("input", { type: "number", name, id: "filter-" + name, step, value: params[name] || "" }));
  const form = el("form", { class: "filters", id: "filters" },
    select("split", "split", [option("", "all", !params.split), ...Object.entries(d.splits).map(([s, n]) => option(s, `${s} (${n})`, params.split === s))]),
    select("label", "label", [option("", "all", !params.label), ...d.labels.map(l => option(l, l, params.label === l))]),
    d.clusters.length ? select("cluster", "cluster", [option("", "all", !params.cluster),
      ...d.clusters.map(c => option(String(c.id), `${c.name} (${c.mixtures})`, params.cluster === String(c.id)))]) : null,
    number("min_events", "events ≥", 1), number("max_events", "events ≤", 1),
    number("min_snr", "SNR ≥ dB", 0.5), number("max_snr", "SNR ≤ dB", 0.5),
    el("label", {}, "text in captions", el("input", { type: "search", name: "text", id: "filter-text", value: params.text || "", placeholder: "dog bark" })),
    el("button", { type: "reset", id: "filter-reset" }, "Clear"));
  let timer = null;
  const apply = () => {
    const values = {};
    for (const name of FILTERS) { const f = form.elements[name]; if (f && f.value !== "") values[name] = f.value; }
    location.hash = "#/" + query(values);
  };
  form.addEventListener("change", apply);
  form.addEventListener("input", e => { if (e.target.name === "text") { clearTimeout(timer); timer = setTimeout(apply, 250); } });
  form.addEventListener("submit", e => { e.preventDefault(); apply(); });
  form.addEventListener("reset", () => setTimeout(() => { location.hash = "#/"; }, 0));
  return form;
}

async function loadList(params) {
  const box = document.getElementById("list");
  const request = {};
  for (const name of FILTERS) if (params[name]) request[name] = params[name];
  request.page = params.page || 1;
  request.per_page = params.per_page || 25;
  const ticket = ++state.listTicket;  // a slower answer to an older filter must not overwrite a newer one
  let data;
  try { data = await api("mixtures" + query(request)); } catch (e) { box.replaceChildren(el("p", { class: "error", text: e.message })); return; }
  if (ticket !== state.listTicket || !document.body.contains(box)) return;
  const pages = Math.max(1, Math.ceil(data.total / data.per_page));
  const go = page => { location.hash = "#/" + query({ ...params, page }); };
  const rows = data.rows.map(r => el("tr", { class: "clickable mixture-row", dataset: { id: r.id }, onclick: () => { location.hash = "#/mix/" + encodeURIComponent(r.id); } },
    el("td", {}, el("a", { href: "#/mix/" + encodeURIComponent(r.id), text: r.id })),
    el("td", { text: r.split }), el("td", { class: "num", text: fmt(r.duration_s, 1) }), el("td", { class: "num", text: r.events }),
    el("td", { class: "num", text: r.snr_db ? `${fmt(r.snr_db[0], 1)} – ${fmt(r.snr_db[1], 1)}` : "–" }),
    el("td", { class: "labels" }, r.labels.map(l => el("span", { text: l }))),
    el("td", { text: r.caption })));
  box.replaceChildren(
    el("div", { class: "pager" },
      el("button", { id: "prev-page", disabled: data.page <= 1 ? true : null, onclick: () => go(data.page - 1) }, "‹ Previous"),
      el("span", { id: "list-total", dataset: { total: data.total, page: data.page, pages, request: query(request) } },
         `page ${data.page} of ${pages} · ${data.total} mixtures`),
      el("button", { id: "next-page", disabled: data.page >= pages ? true : null, onclick: () => go(data.page + 1) }, "Next ›")),
    el("table", { id: "mixtures" },
      el("thead", {}, el("tr", {}, ["id", "split", "s", "events", "SNR dB", "labels", "caption"].map((h, i) => el("th", { class: i >= 2 && i <= 4 ? "num" : null, text: h })))),
      el("tbody", {}, rows)));
}

function renderList(params) {
  setNav("dataset");
  const main = document.getElementById("main");
  if (!state.info.dataset) {
    main.replaceChildren(el("p", { class: "note", text: "No dataset is served: start sedsynth view with a shard or mixtures folder (or --data)." }));
    return;
  }
  const form = document.getElementById("filters");
  if (form) for (const name of FILTERS) { const f = form.elements[name]; if (f && f !== document.activeElement) f.value = params[name] || ""; }
  else {
    const d = state.info.dataset;
    main.replaceChildren(el("h2", { text: `${d.folder} · ${d.mixtures} mixtures (${d.kind})` }), listForm(params), el("div", { id: "list" }));
  }
  loadList(params);
}

// ---------- one clip ----------

function pct(t, duration) { return (100 * Math.max(0, Math.min(duration, t)) / duration) + "%"; }

function boxes(cls, spans, duration, extra) {
  return spans.map(([on, off, peak]) => {
    const node = el("div", { class: cls, title: `${seconds(on)} – ${seconds(off)}` + (peak !== undefined ? ` · peak ${fmt(peak)}` : ""),
                             dataset: { onset: on, offset: off, ...(extra || {}) } });
    node.style.left = pct(on, duration);
    node.style.width = pct(off, duration) === pct(on, duration) ? "1px" : `calc(${pct(off, duration)} - ${pct(on, duration)})`;
    return node;
  });
}

function playFrom(t) {
  const player = document.getElementById("player");
  if (!player) return;
  player.currentTime = t;
  player.play().catch(() => {});
}

// the y axis runs from 0 to ``top``: 1, or a little above the peak and the threshold when both are far below 1,
// so an untrained model's small probabilities still show their shape (the gutter says the scale)
function yTop(probs, threshold) {
  const high = Math.max(...probs, threshold || 0);
  return high > 0.5 ? 1 : Math.max(1e-3, Math.min(1, high * 1.2));
}

function drawProbs(canvas, timestamps, probs, threshold, duration, colour) {
  const dpr = window.devicePixelRatio || 1;
  const top = yTop(probs, threshold);
  const w = Math.max(1, Math.round(canvas.clientWidth * dpr)), h = Math.max(1, Math.round(canvas.clientHeight * dpr));
  canvas.width = w; canvas.height = h;
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, w, h);
  const x = t => (t / duration) * w, y = p => h - 2 - (Math.min(p, top) / top) * (h - 12);
  g.beginPath();
  g.moveTo(x(timestamps[0]), h);
  for (let i = 0; i < probs.length; i++) { g.lineTo(x(timestamps[i]), y(probs[i])); g.lineTo(x(timestamps[i + 1]), y(probs[i])); }
  g.lineTo(x(timestamps[probs.length]), h);
  g.closePath();
  g.fillStyle = colour + "55"; g.fill();
  g.strokeStyle = colour; g.lineWidth = 1.5 * dpr; g.stroke();
  if (threshold !== null && threshold !== undefined) {
    g.setLineDash([4 * dpr, 4 * dpr]); g.strokeStyle = "#444"; g.lineWidth = dpr;
    g.beginPath(); g.moveTo(0, y(threshold)); g.lineTo(w, y(threshold)); g.stroke(); g.setLineDash([]);
  }
}

function runsAbove(timestamps, probs, threshold) {
  const out = [];
  let start = null;
  for (let i = 0; i <= probs.length; i++) {
    const on = i < probs.length && probs[i] >= threshold;
    if (on && start === null) start = i;
    if (!on && start !== null) { out.push([timestamps[start], timestamps[i], Math.max(...probs.slice(start, i))]); start = null; }
  }
  return out;
}

function probRow(label, kind, result, k, duration) {
  const probs = result.probs[k], timestamps = result.timestamps_s;
  const top = yTop(probs, result.threshold);
  const canvas = el("canvas", { class: "prob", dataset: { frames: probs.length, max: Math.max(...probs), threshold: result.threshold, top } });
  const events = result.events ? result.events[k] : runsAbove(timestamps, probs, result.threshold);
  const truth = result.truth ? result.truth[k] : null;
  const track = el("div", { class: "track" }, canvas, boxes("event", events, duration, { query: label }), truth ? boxes("truth", truth, duration, { query: label }) : []);
  seekOnClick(track, duration);
  const row = el("div", { class: "row prob-row " + kind, dataset: { query: label, events: events.length, truth: truth ? truth.length : "unknown" } },
    el("div", { class: "gutter", title: label }, el("div", { text: label }),
      el("div", { text: `peak ${fmt(Math.max(...probs))}` + (top < 1 ? ` · y 0–${fmt(top, top < 0.01 ? 4 : 3)}` : "") }),
      truth === null ? el("div", { text: "truth unknown" }) : null), track);
  const draw = () => drawProbs(canvas, timestamps, probs, result.threshold, duration, kind === "stored" ? "#7048e8" : "#2f6fdf");
  state.clip.draws.push(draw);
  requestAnimationFrame(draw);
  return row;
}

function seekOnClick(track, duration) {
  track.addEventListener("click", e => {
    if (e.target.dataset.onset !== undefined) { playFrom(Number(e.target.dataset.onset)); return; }  // a segment or event: from its onset
    const r = track.getBoundingClientRect();
    playFrom(((e.clientX - r.left) / r.width) * duration);
  });
}

async function runQuery(clip, texts) {
  const out = document.getElementById("query-rows"), note = document.getElementById("query-status");
  note.textContent = "scoring…"; note.className = "note";
  try {
    const result = await api("detect", { method: "POST", headers: { "Content-Type": "application/json" },
                                          body: JSON.stringify({ ...(clip.upload ? { upload: clip.upload } : { id: clip.id }), queries: texts }) });
    if (state.clip !== clip) return;
    clip.draws = clip.draws.filter(d => !d.live);
    const rows = result.queries.map((q, k) => probRow(q, "live", result, k, clip.duration));
    out.replaceChildren(...rows);
    note.textContent = `${result.queries.length} quer${result.queries.length === 1 ? "y" : "ies"} in ${fmt(result.seconds, 2)} s · threshold ${fmt(result.threshold, 4)} after a ${result.median_filter_frames}-frame median filter`;
    note.id = "query-status"; note.dataset.done = "1";
  } catch (e) { note.textContent = e.message; note.className = "error"; }
}

async function renderClip(kind, key, params) {
  setNav(kind === "upload" ? "detect" : "dataset");
  const main = document.getElementById("main");
  let meta;
  try { meta = kind === "upload" ? await api("upload" + query({ token: key })) : await api("mixture" + query({ id: key })); }
  catch (e) { main.replaceChildren(el("p", { class: "error", id: "clip-error", text: `${key}: ${e.message}` })); return; }
  const source = kind === "upload" ? { upload: key } : { id: key };
  const duration = meta.duration_s;
  const clip = { id: kind === "upload" ? null : key, upload: kind === "upload" ? key : null, duration, draws: [], phrases: meta.phrases || [] };
  state.clip = clip;
  const player = el("audio", { id: "player", controls: true, preload: "auto", src: "api/audio" + query(source) });
  const spectrogram = el("img", { id: "spectrogram", alt: "spectrogram", src: "api/spectrogram" + query(source) });
  const nyquist = (meta.sample_rate_hz || 16000) / 2000;
  const specTrack = el("div", { class: "track" }, spectrogram);
  seekOnClick(specTrack, duration);
  const lanes = clip.phrases.map(p => {
    const track = el("div", { class: "track lane-track" }, boxes("segment", p.segments, duration, { phrase: p.phrase, label: p.label }));
    for (const s of track.querySelectorAll(".segment")) s.addEventListener("click", e => { e.stopPropagation(); playFrom(Number(s.dataset.onset)); });
    seekOnClick(track, duration);
    return el("div", { class: "row lane", dataset: { phrase: p.phrase, label: p.label } },
      el("div", { class: "gutter", title: `${p.phrase} (${p.label})`, text: p.phrase }), track);
  });
  const step = duration > 120 ? 30 : duration > 30 ? 5 : 1;
  const ticks = [];
  for (let t = 0; t <= duration + 1e-9; t += step) { const tick = el("span", { class: "tick", text: `${Math.round(t)}` }); tick.style.left = pct(t, duration); ticks.push(tick); }
  const playhead = el("div", { class: "playhead", id: "playhead", dataset: { time: 0 } });
  const timeline = el("div", { class: "timeline", id: "timeline", dataset: { duration } },
    el("div", { class: "row spec-row" }, el("div", { class: "gutter" }, el("span", { text: `${fmt(nyquist, 0)} kHz` }), el("span", { text: "0 Hz" })), specTrack),
    lanes,
    el("div", { id: "stored-rows" }),
    el("div", { id: "query-rows" }),
    el("div", { class: "row axis" }, el("div", { class: "gutter", text: "seconds" }), el("div", { class: "track" }, ticks)),
    el("div", { class: "overlay" }, playhead));

  const detect = state.info.detect;
  const queryForm = el("form", { class: "query", id: "query-form" },
    el("input", { id: "query-input", type: "text", placeholder: "text queries, separated by ;  e.g.  dog barking; car horn", autocomplete: "off",
                  disabled: detect.available ? null : true }),
    el("button", { id: "query-button", type: "submit", disabled: detect.available ? null : true }, "Detect"));
  queryForm.addEventListener("submit", e => {
    e.preventDefault();
    const texts = document.getElementById("query-input").value.split(/[;\n]/).map(s => s.trim()).filter(Boolean);
    if (texts.length) runQuery(clip, texts);
  });
  const phraseTable = clip.phrases.length ? el("table", { id: "phrases" },
    el("thead", {}, el("tr", {}, ["phrase", "label", "cluster", "segments (s)", "SNR dB", "source clips"].map(h => el("th", { text: h })))),
    el("tbody", {}, clip.phrases.map(p => el("tr", { dataset: { phrase: p.phrase } },
      el("td", {}, el("a", { href: "#", text: p.phrase, onclick: e => { e.preventDefault(); document.getElementById("query-input").value = p.phrase; queryForm.requestSubmit(); } })),
      el("td", { text: p.label }), el("td", { text: p.cluster || (p.cluster_id ?? "–") }),
      el("td", {}, p.segments.map(([a, b]) => el("a", { href: "#", class: "seg-link", text: `${fmt(a, 2)}–${fmt(b, 2)} `, onclick: e => { e.preventDefault(); playFrom(a); } }))),
      el("td", { class: "num", text: p.snr_db.length ? p.snr_db.map(x => fmt(x, 1)).join(", ") : "–" }),
      el("td", { text: p.source_clip_ids.join(", ") || "–" }))))) : null;

  main.replaceChildren(
    el("div", { class: "clip-head" }, el("h2", { id: "clip-title", text: kind === "upload" ? meta.name : meta.id }),
      el("span", { class: "note", text: [meta.split, seconds(duration), meta.sample_rate_hz ? `${meta.sample_rate_hz} Hz` : null, meta.background_id ? `background ${meta.background_id}` : null,
                                          meta.license].filter(Boolean).join(" · ") })),
    meta.caption ? el("p", { class: "caption", id: "caption", text: meta.caption }) : null,
    player, timeline,
    el("p", { class: "legend" }, el("i", { class: "l-truth" }), "labelled segment (click: play from its onset)", el("i", { class: "l-prob" }), "frame probability",
      el("i", { class: "l-event" }), "event found at the threshold (dashed)"),
    queryForm,
    el("p", { id: "query-status", class: detect.available ? "note" : "error",
              text: detect.available ? `checkpoint ${detect.checkpoint}` : (detect.error ? `queries are off: ${detect.error}` : "queries are off: no checkpoint (start with --checkpoint PATH)") }),
    phraseTable ? el("h3", { text: "Phrases" }) : null, phraseTable);

  const tick = () => {
    if (state.clip !== clip) return;
    const t = player.currentTime || 0;
    playhead.style.left = pct(t, duration);
    playhead.dataset.time = t.toFixed(3);
    state.frame = requestAnimationFrame(tick);
  };
  state.frame = requestAnimationFrame(tick);
  state.resize = () => clip.draws.forEach(d => d());
  window.addEventListener("resize", state.resize);

  const start = Number(params.t);
  if (Number.isFinite(start) && start > 0) {
    const seek = () => { player.currentTime = start; };
    if (player.readyState >= 1) seek(); else player.addEventListener("loadedmetadata", seek, { once: true });
  }
  if (params.q) { document.getElementById("query-input").value = params.q; if (detect.available) runQuery(clip, params.q.split(";").map(s => s.trim()).filter(Boolean)); }
  if (params.eval && params.model && clip.id) {
    try {
      const stored = await api("evaluation/scores" + query({ model: params.model, clip: clip.id, class: params.eval }));
      if (state.clip !== clip) return;
      const result = { probs: [stored.probs], timestamps_s: stored.timestamps_s, threshold: stored.threshold, truth: [stored.truth] };
      document.getElementById("stored-rows").replaceChildren(probRow(`${stored.query} (${params.model}, evaluated)`, "stored", result, 0, duration));
    } catch (e) { document.getElementById("stored-rows").replaceChildren(el("p", { class: "error", text: e.message })); }
  }
}

// ---------- detect: upload ----------

function renderDetect() {
  setNav("detect");
  const detect = state.info.detect, limit = state.info.max_upload_bytes;
  const file = el("input", { type: "file", id: "upload-file", accept: "audio/*,.wav,.flac,.ogg,.mp3,.aiff" });
  const note = el("p", { id: "upload-status", class: "note", text: `at most ${fmt(limit / 1048576, 0)} MiB; WAV, FLAC, OGG, MP3 or anything libsndfile reads` });
  const form = el("form", { class: "panel", id: "upload-form" }, el("h3", { text: "Query your own audio" }), file, " ", el("button", { type: "submit", id: "upload-button" }, "Upload"), note);
  form.addEventListener("submit", async e => {
    e.preventDefault();
    if (!file.files.length) { note.textContent = "choose a file first"; return; }
    if (file.files[0].size > limit) { note.textContent = `the file is larger than the limit (${fmt(limit / 1048576, 0)} MiB)`; note.className = "error"; return; }
    const body = new FormData(); body.append("file", file.files[0]);
    note.textContent = "uploading…";
    try { const record = await api("upload", { method: "POST", body }); location.hash = "#/upload/" + record.token; }
    catch (err) { note.textContent = err.message; note.className = "error"; }
  });
  document.getElementById("main").replaceChildren(
    el("h2", { text: "Detect" }),
    el("p", { class: detect.available ? "note" : "error", id: "detector-info",
              text: detect.available ? `checkpoint ${detect.checkpoint}` + (detect.threshold !== undefined ? ` · threshold ${fmt(detect.threshold, 4)} (${detect.threshold_source})` : " (loading)")
                                     : (detect.error || "no checkpoint: start sedsynth view with --checkpoint PATH") }),
    el("p", { class: "note", text: "Open a mixture from the Dataset view to query it beside its labels, or upload a file:" }),
    form);
}

// ---------- evaluation ----------

const HEADLINE = ["psds1", "psds1_astat0", "psds2", "auroc", "pauroc", "f1", "f1_micro", "segment_f1", "frame_auroc", "alignment",
                  "a2t_r1", "t2a_r1", "zero_shot_accuracy", "zero_shot_frame_accuracy"];

function errorTable(id, rows, model) {
  if (!rows.length) return el("p", { class: "note", id, text: "none" });
  return el("table", { id },
    el("thead", {}, el("tr", {}, ["clip", "class", "query", "onset s", "offset s", "peak"].map((h, i) => el("th", { class: i >= 3 ? "num" : null, text: h })))),
    el("tbody", {}, rows.map(e => {
      const href = "#/mix/" + encodeURIComponent(e.clip) + query({ t: e.onset_s.toFixed(3), eval: e.class, model });
      return el("tr", { class: "clickable error-row", dataset: { clip: e.clip, label: e.class, onset: e.onset_s, offset: e.offset_s },
                        onclick: () => { location.hash = href; } },
        el("td", {}, el("a", { href, class: "error-link", text: e.clip })), el("td", { text: e.class }), el("td", { text: e.query }),
        el("td", { class: "num", text: fmt(e.onset_s, 2) }), el("td", { class: "num", text: fmt(e.offset_s, 2) }), el("td", { class: "num", text: fmt(e.peak, 4) }));
    })));
}

async function renderEvaluation(params) {
  setNav("evaluation");
  const main = document.getElementById("main");
  if (!state.info.evaluation) {
    main.replaceChildren(el("p", { class: "note", text: "No evaluation is served: start sedsynth view with an evaluation folder (or --evaluation)." }));
    return;
  }
  let summary;
  try { summary = await api("evaluation"); } catch (e) { main.replaceChildren(el("p", { class: "error", text: e.message })); return; }
  const model = summary.models.includes(params.model) ? params.model : summary.models[0];
  const models = Object.keys(summary.headline);
  const keys = [...HEADLINE.filter(k => models.some(m => k in summary.headline[m])),
                ...[...new Set(models.flatMap(m => Object.keys(summary.headline[m])))].filter(k => !HEADLINE.includes(k)).sort()];
  const headline = el("table", { class: "metrics", id: "headline" },
    el("thead", {}, el("tr", {}, el("th", { text: "metric" }), models.map(m => el("th", { class: "num", text: m })))),
    el("tbody", {}, keys.map(k => el("tr", {}, el("td", { text: k }), models.map(m => el("td", { class: "num", text: fmt(summary.headline[m][k]) }))))));
  const rows = summary.per_class[model] || [];
  const columns = rows.length ? ["class", "query", ...Object.keys(rows[0]).filter(c => c !== "class" && c !== "query")] : [];
  const perClass = el("table", { id: "per-class" },
    el("thead", {}, el("tr", {}, columns.map(c => el("th", { class: c === "class" || c === "query" ? null : "num", text: c })))),
    el("tbody", {}, rows.map(r => el("tr", { dataset: { label: r.class } }, columns.map(c => el("td", { class: c === "class" || c === "query" ? null : "num", text: fmt(r[c]) }))))));
  const picker = el("select", { id: "eval-model", onchange: e => { location.hash = "#/evaluation" + query({ model: e.target.value }); } },
    summary.models.map(m => el("option", { value: m, selected: m === model ? true : null, text: m })));
  const errors = el("div", { id: "errors" }, el("p", { class: "note", text: "reading the score files…" }));
  main.replaceChildren(
    el("h2", { text: `Evaluation · ${summary.folder}` }),
    el("p", { class: "note", text: `${summary.split} split: ${summary.clips} clips, ${summary.events} events · collar F1 threshold ${fmt(summary.threshold, 4)}` +
                                   (summary.threshold_source ? ` (${summary.threshold_source})` : "") }),
    el("div", { class: "split" },
      el("div", {}, el("h3", { text: "Figures" }), headline),
      el("div", {}, el("h3", {}, "Per class · model ", picker), perClass)),
    errors);
  try {
    const found = await api("evaluation/errors" + query({ model }));
    errors.replaceChildren(el("div", { class: "split" },
      el("div", {}, el("h3", { text: `Worst false alarms (${found.false_alarm_count}): runs at or above the threshold that touch no labelled segment` }),
        errorTable("false-alarms", found.false_alarms, model)),
      el("div", {}, el("h3", { text: `Worst misses (${found.miss_count}): labelled segments whose probability stays below the threshold` }),
        errorTable("misses", found.misses, model))));
  } catch (e) { errors.replaceChildren(el("p", { class: "error", text: e.message })); }
}

// ---------- start ----------

async function render() {
  const { parts, params } = route();
  const listOpen = !!document.getElementById("filters");
  if (parts.length === 0) { if (!listOpen) stopClip(); if (!listOpen) document.getElementById("main").replaceChildren(); renderList(params); return; }
  stopClip();
  document.getElementById("main").replaceChildren(el("p", { class: "note", text: "Loading…" }));
  if (parts[0] === "mix" && parts[1]) return renderClip("mix", parts[1], params);
  if (parts[0] === "upload" && parts[1]) return renderClip("upload", parts[1], params);
  if (parts[0] === "detect") return renderDetect();
  if (parts[0] === "evaluation") return renderEvaluation(params);
  document.getElementById("main").replaceChildren(el("p", { class: "error", text: "no such page" }));
}

async function start() {
  try { state.info = await api("info"); } catch (e) { document.getElementById("main").replaceChildren(el("p", { class: "error", text: e.message })); return; }
  const d = state.info.dataset, ev = state.info.evaluation;
  status([d ? `${d.mixtures} mixtures` : null, ev ? `evaluation of ${ev.split}` : null, state.info.detect.available ? "queries on" : "queries off"].filter(Boolean).join(" · "));
  if (!d && ev && !location.hash) location.hash = "#/evaluation";
  window.addEventListener("hashchange", render);
  await render();
  document.body.dataset.ready = "1";
}

start();
