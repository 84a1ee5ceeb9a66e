// The usage dashboard's live tail: rows from the WebSocket, newest first.
(function () {
  "use strict";

  var FIRST_DELAY = 1000;
  var MAX_DELAY = 30000;

  var table = document.getElementById("live-tail");
  var status = document.getElementById("live-tail-status");
  if (!table || !status) {
    return;
  }
  var body = table.tBodies[0];
  var maxRows = parseInt(table.dataset.maxRows, 10) || 50;
  var keyPrefix = table.dataset.keyPrefix || "";
  var alias = (table.dataset.alias || "").toLowerCase();
  var endpoint = table.dataset.endpoint || "";
  var delay = FIRST_DELAY;

  function setState(state, text) {
    status.dataset.tailStatus = state;
    status.textContent = text || state;
  }

  function number(value) {
    return value === null || value === undefined ? "—" : String(Math.round(value));
  }

  function time(iso) {
    var date = iso ? new Date(iso) : new Date();
    return date.toLocaleTimeString();
  }

  function matches(request) {
    // The same key, alias and endpoint filters as the rest of the page (alias ignores case).
    return (!keyPrefix || request.key_prefix === keyPrefix) &&
      (!alias || (request.alias || "").toLowerCase() === alias) &&
      (!endpoint || request.endpoint === endpoint);
  }

  function addRow(request) {
    if (!matches(request)) {
      return;
    }
    var cells = [
      time(request.time),
      request.endpoint || "",
      request.key_prefix + "…",
      request.alias || "(no alias)",
      request.error_type ? request.status + " " + request.error_type : String(request.status),
      request.stream ? "yes" : "no",
      request.prompt_tokens + " + " + request.completion_tokens + " = " + request.total_tokens,
      number(request.duration_ms),
      number(request.ttft_ms),
      (request.finish_reasons || []).join(", "),
      request.cancelled ? "yes" : "no",
    ];
    var numeric = [4, 6, 7, 8];
    var row = document.createElement("tr");
    row.className = "tail-row";
    if (request.status >= 400 || request.error_type) {
      row.classList.add("tail-failed");
    }
    row.dataset.requestId = request.request_id || "";
    cells.forEach(function (text, index) {
      var cell = row.insertCell();
      cell.textContent = text; // text, never markup: aliases are user data
      if (numeric.indexOf(index) !== -1) {
        cell.className = "num";
      }
    });
    var waiting = body.querySelector(".tail-waiting");
    if (waiting) {
      waiting.remove();
    }
    body.insertBefore(row, body.firstChild);
    while (body.rows.length > maxRows) {
      body.deleteRow(-1);
    }
  }

  function connect() {
    setState("connecting");
    var scheme = location.protocol === "https:" ? "wss:" : "ws:";
    var socket = new WebSocket(scheme + "//" + location.host + table.dataset.wsPath);
    socket.addEventListener("open", function () {
      delay = FIRST_DELAY;
      setState("live");
    });
    socket.addEventListener("message", function (event) {
      var message;
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (message.type === "request" && message.request) {
        addRow(message.request);
      }
    });
    socket.addEventListener("close", function () {
      // Jitter keeps many open dashboards from reconnecting in step after a restart.
      var wait = delay + Math.random() * delay * 0.2;
      setState("closed", "closed, retrying in " + Math.ceil(wait / 1000) + " s");
      delay = Math.min(delay * 2, MAX_DELAY);
      window.setTimeout(connect, wait);
    });
  }

  connect();
})();
