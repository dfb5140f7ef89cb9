// jobrun console: live run page, select-all, confirmations. No build step, no libraries.
"use strict";

function pollLive(live) {
  const interval = Number(live.dataset.intervalMs) || 2000;
  let timer = null;

  function state() {
    return live.querySelector(".live-state");
  }

  function running() {
    const found = state();
    return found !== null && found.dataset.running === "yes";
  }

  async function refresh() {
    timer = null;
    if (document.hidden || !running()) {
      return;
    }
    // Typing a cancel reason must not be wiped by a refresh.
    if (live.contains(document.activeElement) && document.activeElement.tagName === "INPUT") {
      schedule();
      return;
    }
    const previous = state().dataset.poll || "";
    try {
      const response = await fetch(
        live.dataset.liveUrl + "?prev=" + encodeURIComponent(previous),
        { credentials: "same-origin", headers: { Accept: "text/html" } },
      );
      if (response.ok) {
        live.innerHTML = await response.text();
        live.dispatchEvent(new CustomEvent("jobrun:refreshed"));
      }
    } catch (error) {
      // The server may be restarting: try again at the next tick.
    }
    schedule();
  }

  function schedule() {
    if (timer === null && !document.hidden && running()) {
      timer = window.setTimeout(refresh, interval);
    }
  }

  // Polling pauses while the tab is hidden and resumes when it is shown again.
  document.addEventListener("visibilitychange", () => {
    if (document.hidden && timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    } else if (!document.hidden) {
      schedule();
    }
  });
  schedule();
}

function confirmForms() {
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
}

function selectAll() {
  const all = document.getElementById("select-all");
  if (all === null) {
    return;
  }
  all.addEventListener("change", () => {
    for (const box of document.querySelectorAll('input[name="run_id"][form="selected"]')) {
      box.checked = all.checked;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live !== null) {
    pollLive(live);
  }
  confirmForms();
  selectAll();
});
