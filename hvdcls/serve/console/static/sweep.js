// A sweep's page: the best value so far against the trial's number (uPlot: a stepped line, with
// each done trial's value and each pruned one's where it stopped as points), its summary and its
// trials' rows, kept live by polling live.json every 2 s (hvdcls.follow, rows.js).
"use strict";
(function () {
  const POLL_MS = 2000;
  const data = JSON.parse(document.getElementById("sweep-data").textContent);
  const table = document.getElementById("trials");
  const element = document.getElementById("chart-best");
  let chart = data.chart;

  function columns() {
    return [chart.numbers, chart.best, chart.done, chart.pruned];
  }
  const dots = (fill, size) => ({show: true, size: size, fill: fill});
  const plot = new uPlot({
    title: "best " + data.metric + " so far", width: Math.max(480, element.parentElement.clientWidth - 40),
    height: 280, scales: {x: {time: false}},
    axes: [{label: "trial", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]}, {label: data.metric}],
    series: [
      {label: "trial"},
      {label: "best so far", stroke: "#2f6fde", width: 2, spanGaps: true, points: {show: false},
       paths: uPlot.paths.stepped({align: 1})},
      {label: "done", stroke: "#17683a", paths: () => null, points: dots("#17683a", 7)},
      {label: "pruned (where it stopped)", stroke: "#e67e22", paths: () => null, points: dots("#ffffff", 6)},
    ],
  }, columns(), element);

  const url = "/console/sweeps/" + encodeURIComponent(data.id) + "/live.json";
  hvdcls.follow(table, url, POLL_MS, () => ({}), update => {
    document.getElementById("summary").innerHTML = update.summary;  // server-rendered, autoescaped
    document.getElementById("total").textContent = update.order.length;
    chart = update.chart;
    plot.setData(columns());
    element.dataset.points = String(chart.numbers.length);
  });
})();
