// kafka-gateway console: live charts of produce and consume rates.
// Each <section class="chart" data-rates="URL" data-series="bytes|records"> polls
// its URL (counters, webui/model.py rates) once a second and plots the rates of
// the last two minutes with uPlot. The section's data-points and data-last
// attributes say what was drawn (the browser test reads them).
"use strict";

(function () {
  const INTERVAL_MS = 1000;
  const KEEP = 120;
  const SERIES = {
    bytes: [["produced", "bytes_in", "#1f6feb"], ["fetched", "bytes_out", "#d97706"]],
    records: [["appended", "records_in", "#16a34a"], ["committed", "records_out", "#9333ea"]],
  };

  function formatValue(value) {
    if (value == null) return "-";
    const units = ["", "k", "M", "G"];
    let unit = 0;
    while (Math.abs(value) >= 1000 && unit < units.length - 1) { value /= 1000; unit++; }
    const digits = unit || (!Number.isInteger(value) && Math.abs(value) < 10) ? 1 : 0;
    return value.toFixed(digits) + units[unit];
  }

  function makeChart(section) {
    const kind = section.dataset.series;
    const series = SERIES[kind];
    const area = section.querySelector(".chart-area");
    const data = [[], ...series.map(() => [])];
    const plot = new uPlot({
      width: Math.max(area.clientWidth, 300),
      height: 200,
      series: [{}, ...series.map(([label, , color]) => ({
        label, stroke: color, width: 2, fill: color + "22", value: (u, v) => formatValue(v),
      }))],
      axes: [{}, { values: (u, splits) => splits.map(formatValue), size: 60 }],
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
    }, data, area);
    return { section, series, data, plot };
  }

  function addPoint(chart, previous, current) {
    const seconds = current.time - previous.time;
    if (seconds <= 0) return;
    chart.data[0].push(current.time);
    chart.series.forEach(([, key], index) => {
      // counters only grow, except when a topic or group is deleted: no negative rates
      chart.data[index + 1].push(Math.max(current[key] - previous[key], 0) / seconds);
    });
    if (chart.data[0].length > KEEP) chart.data.forEach((column) => column.shift());
    chart.plot.setData(chart.data);
    const last = {};
    chart.series.forEach(([label], index) => { last[label] = chart.data[index + 1].at(-1); });
    chart.section.dataset.points = String(chart.data[0].length);
    chart.section.dataset.last = JSON.stringify(last);
  }

  function start() {
    const byUrl = new Map();
    document.querySelectorAll("section.chart[data-rates]").forEach((section) => {
      const url = section.dataset.rates;
      if (!byUrl.has(url)) byUrl.set(url, { charts: [], previous: null });
      byUrl.get(url).charts.push(makeChart(section));
    });
    async function poll() {
      for (const [url, entry] of byUrl) {
        try {
          const response = await fetch(url, { cache: "no-store" });
          if (!response.ok) continue;
          const current = await response.json();
          if (entry.previous) entry.charts.forEach((c) => addPoint(c, entry.previous, current));
          entry.previous = current;
        } catch (error) {
          console.warn("rates", url, error);  // the gateway restarting: try again next tick
        }
      }
    }
    if (byUrl.size) {
      poll();
      setInterval(poll, INTERVAL_MS);
      window.addEventListener("resize", () => byUrl.forEach((entry) => entry.charts.forEach(
        (c) => c.plot.setSize({ width: Math.max(c.section.querySelector(".chart-area").clientWidth, 300), height: 200 }))));
    }
  }

  document.addEventListener("DOMContentLoaded", start);
})();
