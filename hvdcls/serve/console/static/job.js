// A job's page: its curves (uPlot), state and logs (stdout, stderr), kept live by polling
// live.json for what the page lacks (epochs after the ones drawn, log bytes after the ones
// shown) until the job ends.
"use strict";
(function () {
  const POLL_MS = 1500, LOG_LINES = 2000;
  const FINAL = ["succeeded", "failed", "cancelled"];
  const data = JSON.parse(document.getElementById("job-data").textContent);
  const points = data.points.slice();
  const offsets = {log: data.log_offset, err: data.err_offset};  // the logs' bytes shown, by element id
  let state = data.state, lastProgress = null;

  const CHARTS = [
    {id: "chart-loss", title: "loss", series: [["train_loss", "train", "#2f6fde"], ["val_loss", "validation", "#e67e22"]]},
    {id: "chart-accuracy", title: "accuracy", series: [["train_accuracy", "train", "#2f6fde"], ["val_accuracy", "validation", "#e67e22"]]},
    {id: "chart-rate", title: "steps per second", series: [["steps_per_second", "steps/s", "#17683a"]]},
  ];
  function columns(chart) {
    return [points.map(p => p.epoch), ...chart.series.map(([key]) => points.map(p => p[key]))];
  }
  // Three side by side where the page is wide enough; epochs are whole numbers on the x axis.
  const width = Math.max(320, Math.floor((document.querySelector(".charts").clientWidth - 40) / 3));
  const plots = CHARTS.map(chart => {
    const element = document.getElementById(chart.id);
    const options = {
      title: chart.title, width: width, height: 240,
      scales: {x: {time: false}},
      axes: [{label: "epoch", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]}, {}],
      series: [{label: "epoch"}, ...chart.series.map(([, label, stroke]) => ({label: label, stroke: stroke, width: 2,
                                                                               points: {show: true, size: 5}}))],
    };
    return {chart: chart, element: element, plot: new uPlot(options, columns(chart), element)};
  });
  function redraw() {
    for (const {chart, element, plot} of plots) {
      plot.setData(columns(chart));
      element.dataset.points = String(points.length);
    }
    document.getElementById("epochs").textContent = points.length;
  }

  function stepRate(progress) {
    // Steps per second between two polls within one epoch, from the job's own progress (its
    // status.json); across an epoch's end the evaluation would count as training.
    if (!progress || !progress.steps_per_epoch) return;
    const now = {t: Date.now() / 1000, epoch: progress.epoch, steps: progress.step};
    if (lastProgress && now.epoch === lastProgress.epoch && now.steps > lastProgress.steps) {
      const rate = (now.steps - lastProgress.steps) / (now.t - lastProgress.t);
      document.getElementById("step-rate").textContent = "· " + rate.toFixed(1) + " steps/s now";
    }
    lastProgress = now;
  }
  function show(update) {
    state = update.state;
    const badge = document.getElementById("state");
    badge.textContent = update.state + (update.stop_requested_at && !FINAL.includes(update.state) ? " (stopping)" : "");
    badge.className = "state state-" + update.state;
    document.getElementById("phase").textContent = update.phase || "-";
    document.getElementById("message").textContent = update.message || "-";
    document.getElementById("hosts").textContent =
      Object.entries(update.hosts || {}).map(([h, n]) => h + ":" + n).join(", ") || "-";
    const progress = update.progress;
    if (progress) {
      document.getElementById("progress").value = progress.fraction;
      document.getElementById("progress-text").textContent = "epoch " + progress.epoch + "/" + progress.epochs +
        ", step " + progress.step + "/" + progress.steps_per_epoch;
    }
    stepRate(progress);
    const cell = document.getElementById("elapsed");
    cell.dataset.since = update.started_at || cell.dataset.since;
    cell.dataset.until = update.ended_at || "";
    const resizes = document.getElementById("resizes");
    if (resizes) {
      resizes.textContent = update.resizes;
      const list = document.getElementById("resize-list");
      list.replaceChildren(...update.resizes_seen.map(c => {
        const item = document.createElement("li");
        item.textContent = "epoch " + c.epoch + ": " + c.from + " \u2192 " + c.to + " workers";
        return item;
      }));
    }
    const form = document.getElementById("cancel-form");
    if (form && !update.may_cancel) form.remove();
    if (update.points.length) { points.push(...update.points); redraw(); }
    appendLog("log", update.log);
    appendLog("err", update.err);
    if (update.err.text) document.getElementById("stderr-box").open = true;
  }
  function appendLog(id, piece) {
    const log = document.getElementById(id);
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    if (piece.skipped) log.textContent += "\n[... skipped: the log grew faster than it is shown ...]\n";
    if (piece.text) log.textContent += piece.text;
    const lines = log.textContent.split("\n");
    if (lines.length > LOG_LINES) log.textContent = lines.slice(-LOG_LINES).join("\n");
    offsets[id] = piece.offset;
    if (atEnd) log.scrollTop = log.scrollHeight;
  }
  async function poll() {
    const query = new URLSearchParams({epochs: points.length, log: offsets.log, err: offsets.err});
    const reply = await fetch("/console/jobs/" + data.id + "/live.json?" + query, {credentials: "same-origin"});
    if (reply.status === 401) { location.href = "/console/signin"; return; }
    if (reply.ok) show(await reply.json());
    document.body.dataset.polled = String(Number(document.body.dataset.polled || 0) + 1);
    if (!FINAL.includes(state)) setTimeout(poll, document.hidden ? POLL_MS * 4 : POLL_MS);
  }
  for (const id of ["log", "err"]) {
    const log = document.getElementById(id);
    log.scrollTop = log.scrollHeight;
  }
  hvdcls.tick();
  setInterval(hvdcls.tick, 1000);
  if (!FINAL.includes(state)) setTimeout(poll, POLL_MS);
})();
