// The model map's script. Hand-written, with no library but plotly.js: the page
// must work from a file with the network off. Names come from the data, so they
// only ever reach the page through textContent, never innerHTML.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("map-data").textContent);
  const n = data.models.length;
  const mapDiv = document.getElementById("map");
  const plotConfig = { responsive: true, displaylogo: false };
  // Colour-blind-safe categorical palette (Okabe-Ito, then Tableau), cycled.
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
    "#D55E00", "#F0E442", "#000000", "#4E79A7", "#F28E2B", "#59A14F",
    "#B07AA1", "#9C755F", "#EDC948", "#76B7B2", "#FF9DA7"];
  const SELECTED_TRACE = 1;
  const PORTFOLIO_TRACE = 2;
  // The method whose portfolios come from a ladder of total costs, not a k.
  const TOTAL_COST_METHOD = "total-cost";
  const indexByName = new Map();
  data.models.forEach(function (name, i) {
    if (!indexByName.has(name)) indexByName.set(name, i);
  });
  let selected = null;
  let portfolio = [];

  function colorOf(label) { return PALETTE[label % PALETTE.length]; }

  // Metadata: integers as they are, other numbers to four significant digits.
  function formatValue(value) {
    if (value === null || value === undefined) return "\u2014";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return String(value);
    return String(Number(value.toPrecision(4)));
  }

  function formatDistance(value) {
    return value === null || value === undefined ? "\u2014" : value.toFixed(3);
  }

  // Plotly reads a few HTML tags in hover labels; a name is shown as written.
  function plainLabel(text) {
    return String(text)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function formatPercent(value) {
    return value === null || value === undefined
      ? "\u2014" : (100 * value).toFixed(1) + "%";
  }

  function column(index) { return data.xyz.map(function (row) { return row[index]; }); }

  // A small trace drawn over the main one; only these are restyled when the
  // selection or the portfolio changes, so 6,000 points are never rebuilt.
  function highlightCoordinates(indices) {
    return {
      x: [indices.map(function (i) { return data.xyz[i][0]; })],
      y: [indices.map(function (i) { return data.xyz[i][1]; })],
      z: [indices.map(function (i) { return data.xyz[i][2]; })],
      text: [indices.map(function (i) { return plainLabel(data.models[i]); })],
      customdata: [indices.slice()],
    };
  }

  function buildMap() {
    const labels = data.color.labels;
    const hover = data.models.map(function (name, i) {
      return plainLabel(name) + "<br>" + plainLabel(data.color.by) + ": " +
        plainLabel(labels[data.color.values[i]]);
    });
    const main = {
      type: "scatter3d", mode: "markers", name: "models",
      x: column(0), y: column(1), z: column(2),
      hovertext: hover, hoverinfo: "text",
      customdata: data.models.map(function (_, i) { return i; }),
      marker: { size: 3, opacity: 0.8,
        color: data.color.values.map(colorOf) },
      showlegend: false,
    };
    const selection = {
      type: "scatter3d", mode: "markers", name: "selected",
      x: [], y: [], z: [], text: [], customdata: [], hoverinfo: "text",
      marker: { size: 12, color: "rgba(0,0,0,0)",
        line: { color: "#d00", width: 4 }, symbol: "circle-open" },
      showlegend: false,
    };
    const chosen = {
      type: "scatter3d", mode: "markers", name: "portfolio",
      x: [], y: [], z: [], text: [], customdata: [], hoverinfo: "text",
      marker: { size: 6, symbol: "diamond", color: "#111" },
      showlegend: true,
    };
    const layout = {
      margin: { l: 0, r: 0, t: 0, b: 0 },
      scene: { xaxis: { title: { text: "PC 1" } }, yaxis: { title: { text: "PC 2" } },
        zaxis: { title: { text: "PC 3" } } },
      legend: { x: 0, y: 1 },
      uirevision: "keep",  // restyles keep the user's camera
    };
    Plotly.newPlot(mapDiv, [main, selection, chosen], layout, plotConfig);
    mapDiv.on("plotly_click", function (event) {
      const point = event.points && event.points[0];
      if (!point) return;
      // The highlight traces hold only a few points, so map back through the
      // model index each point carries.
      const index = point.curveNumber === 0
        ? point.pointNumber
        : point.data.customdata[point.pointNumber];
      if (index !== undefined && index !== null) select(index);
    });
  }

  function buildLegend() {
    const legend = document.getElementById("legend");
    data.color.labels.forEach(function (label, value) {
      const entry = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = colorOf(value);
      entry.appendChild(swatch);
      entry.appendChild(document.createTextNode(label));
      legend.appendChild(entry);
    });
  }

  function modelLink(index) {
    const link = document.createElement("span");
    link.className = "model-link";
    link.dataset.model = String(index);
    link.textContent = data.models[index];
    link.tabIndex = 0;
    return link;
  }

  function cell(row, text, numeric) {
    const td = document.createElement("td");
    td.textContent = text;
    if (numeric) td.className = "number";
    row.appendChild(td);
    return td;
  }

  function renderFacts(index) {
    const facts = document.getElementById("facts");
    facts.replaceChildren();
    const rows = [];
    if (data.n_evaluations) rows.push(["evaluations", data.n_evaluations[index]]);
    Object.keys(data.metadata || {}).forEach(function (key) {
      rows.push([key, data.metadata[key][index]]);
    });
    rows.forEach(function (pair) {
      const tr = document.createElement("tr");
      facts.appendChild(tr);
      cell(tr, pair[0]);
      cell(tr, formatValue(pair[1]), typeof pair[1] === "number");
    });
  }

  function renderAccuracy(index) {
    const div = document.getElementById("accuracy");
    if (!data.groups || !data.accuracy) { div.hidden = true; return; }
    div.hidden = false;
    Plotly.react(div, [{
      type: "bar", x: data.groups, y: data.accuracy[index],
      marker: { color: "#0072B2" },
      hovertemplate: "%{x}: %{y:.1%}<extra></extra>",
    }], {
      margin: { l: 40, r: 5, t: 20, b: 60 },
      title: { text: "accuracy per group", font: { size: 12 } },
      yaxis: { range: [0, 1], tickformat: ".0%" },
    }, plotConfig);
  }

  function renderNeighbours(index) {
    const body = document.querySelector("#neighbours tbody");
    body.replaceChildren();
    (data.neighbors[index] || []).forEach(function (entry) {
      const tr = document.createElement("tr");
      tr.dataset.model = String(entry[0]);
      tr.tabIndex = 0;
      body.appendChild(tr);
      cell(tr, data.models[entry[0]]);
      cell(tr, formatDistance(entry[1]), true);
      cell(tr, formatPercent(entry[2]), true);
    });
  }

  function renderDuplicates(index) {
    const line = document.getElementById("duplicates");
    line.replaceChildren();
    const duplicates = data.duplicates ? data.duplicates[index] : [];
    if (!duplicates.length) {
      line.textContent = "No near-duplicates.";
      return;
    }
    line.appendChild(document.createTextNode("Near-duplicates: "));
    duplicates.forEach(function (j, position) {
      if (position) line.appendChild(document.createTextNode(", "));
      line.appendChild(modelLink(j));
    });
  }

  function renderConvergence(index) {
    const div = document.getElementById("convergence");
    // Large pools measure convergence on a sample of models only.
    if (!data.convergence ||
        !data.convergence.distance[index].some(function (v) { return v !== null; })) {
      div.hidden = true;
      return;
    }
    div.hidden = false;
    Plotly.react(div, [{
      type: "scatter", mode: "lines+markers",
      x: data.convergence.n, y: data.convergence.distance[index],
      connectgaps: false,  // null: the model has fewer evaluations than n
      hovertemplate: "n=%{x}: %{y:.3f}<extra></extra>",
    }], {
      margin: { l: 45, r: 5, t: 20, b: 35 },
      title: { text: "distance to full embedding vs evaluations",
        font: { size: 12 } },
      xaxis: { type: "log", tickvals: data.convergence.n,
        title: { text: "evaluations n" } },
      yaxis: { rangemode: "tozero" },
    }, plotConfig);
  }

  function select(index) {
    index = Number(index);
    if (!Number.isInteger(index) || index < 0 || index >= n) return;
    selected = index;
    document.getElementById("details").hidden = false;
    document.getElementById("placeholder").hidden = true;
    document.getElementById("model-name").textContent = data.models[index];
    renderFacts(index);
    renderAccuracy(index);
    renderNeighbours(index);
    renderDuplicates(index);
    renderConvergence(index);
    Plotly.restyle(mapDiv, highlightCoordinates([index]), [SELECTED_TRACE]);
    document.body.dataset.selected = String(index);
  }

  // The chosen portfolio, its routing accuracy and a note on what it costs.
  function currentPortfolio() {
    const method = document.getElementById("portfolio-method").value;
    const ladder = data.portfolio.cost_ladder;
    if (method === TOTAL_COST_METHOD) {
      const b = Number(document.getElementById("portfolio-total-cost").value);
      return {
        models: ladder.selections[b], routing: ladder.routing[b],
        note: ladder.by + " " + formatValue(ladder.total_cost[b]) + " of " +
          formatValue(ladder.max_total_cost[b]) + ", among the " +
          ladder.n_priced + " models whose " + ladder.by + " is known",
      };
    }
    const input = document.getElementById("portfolio-k");
    const k = Math.min(Math.max(parseInt(input.value, 10) || 1, 1),
      data.portfolio.max_k);
    const routing = data.portfolio.routing[method];
    // Orders are nested: the best k-model portfolio is the first k entries.
    return { models: data.portfolio.orders[method].slice(0, k),
      routing: routing ? routing[k - 1] : null, note: "" };
  }

  function showPortfolio() {
    const byTotalCost =
      document.getElementById("portfolio-method").value === TOTAL_COST_METHOD;
    document.getElementById("portfolio-k-label").hidden = byTotalCost;
    document.getElementById("portfolio-total-cost-label").hidden = !byTotalCost;
    const chosen = currentPortfolio();
    portfolio = chosen.models;
    Plotly.restyle(mapDiv, highlightCoordinates(portfolio), [PORTFOLIO_TRACE]);
    const list = document.getElementById("portfolio-list");
    list.replaceChildren();
    portfolio.forEach(function (i) {
      const item = document.createElement("li");
      item.appendChild(modelLink(i));
      list.appendChild(item);
    });
    document.getElementById("portfolio-routing").textContent =
      formatPercent(chosen.routing);
    document.getElementById("portfolio-full").textContent =
      formatPercent(data.portfolio.full_pool);
    document.getElementById("portfolio-cost").textContent = chosen.note;
    document.body.dataset.portfolio = portfolio.join(",");
  }

  function addOption(select, value, text) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = text;
    select.appendChild(option);
  }

  function buildPortfolio() {
    const panel = document.getElementById("portfolio");
    if (!data.portfolio) { panel.hidden = true; return; }
    const input = document.getElementById("portfolio-k");
    input.max = String(data.portfolio.max_k);
    input.value = String(data.portfolio.default_k);
    const heldOut = data.portfolio.n_held_out;
    document.getElementById("portfolio-queries").textContent = heldOut
      ? "on the " + heldOut.toLocaleString("en") + " held-out queries"
      : "(no held-out queries)";
    const methods = document.getElementById("portfolio-method");
    Object.keys(data.portfolio.orders).forEach(function (method) {
      addOption(methods, method, method);
    });
    const ladder = data.portfolio.cost_ladder;
    const totalCost = document.getElementById("portfolio-total-cost");
    if (ladder) {
      addOption(methods, TOTAL_COST_METHOD, "coverage within a total cost");
      ladder.max_total_cost.forEach(function (value, b) {
        addOption(totalCost, String(b),
          ladder.by + " \u2264 " + formatValue(value));
      });
      const middle = Math.floor((ladder.max_total_cost.length - 1) / 2);
      totalCost.value = String(middle);
    }
    input.addEventListener("input", showPortfolio);
    methods.addEventListener("change", showPortfolio);
    totalCost.addEventListener("change", showPortfolio);
    showPortfolio();
  }

  // Predicted P(correct) against the observed rate on held-out queries.
  function buildReliability() {
    const reliability = data.reliability;
    if (!reliability) return;
    document.getElementById("reliability").hidden = false;
    document.getElementById("reliability-ece").textContent =
      reliability.ece.toFixed(3);
    Plotly.newPlot(document.getElementById("reliability-chart"), [{
      type: "scatter", mode: "lines", x: [0, 1], y: [0, 1],
      line: { dash: "dot", color: "#999" }, hoverinfo: "skip", showlegend: false,
    }, {
      type: "scatter", mode: "lines+markers",
      x: reliability.predicted, y: reliability.observed,
      customdata: reliability.counts, showlegend: false,
      hovertemplate: "predicted %{x:.2f}, observed %{y:.2f} " +
        "(%{customdata} pairs)<extra></extra>",
    }], {
      margin: { l: 45, r: 5, t: 20, b: 35 },
      xaxis: { range: [0, 1], title: { text: "predicted P(correct)" } },
      yaxis: { range: [0, 1], title: { text: "observed" } },
    }, plotConfig);
  }

  function buildSearch() {
    const names = document.getElementById("model-names");
    const options = data.models.map(function (name) {
      const option = document.createElement("option");
      option.value = name;
      return option;
    });
    names.replaceChildren.apply(names, options);
    const search = document.getElementById("search");
    // "input" fires both on typing and on picking from the datalist.
    search.addEventListener("input", function () {
      const index = indexByName.get(search.value);
      if (index !== undefined) select(index);
    });
  }

  // One listener for every model link and neighbour row, rebuilt or not.
  function followModelLinks(event) {
    if (event.type === "keydown" && event.key !== "Enter") return;
    const target = event.target.closest("[data-model]");
    if (target) select(target.dataset.model);
  }

  function buildSummary() {
    document.getElementById("summary").textContent =
      n.toLocaleString("en") + " models; colour: " + data.color.by +
      ". Click a point, or search for a name.";
  }

  buildSummary();
  buildLegend();
  buildMap();
  buildPortfolio();
  buildReliability();
  buildSearch();
  document.querySelector("aside").addEventListener("click", followModelLinks);
  document.querySelector("aside").addEventListener("keydown", followModelLinks);
  // For tests and for anyone scripting the page from the console.
  window.sklocusMap = { data: data, select: select, showPortfolio: showPortfolio };
  document.body.dataset.ready = "true";
})();
