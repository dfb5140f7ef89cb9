// jobrun console: live run page, refreshing lists, select-all, confirmations. No build step, no libraries.
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

  function typing() {
    return live.contains(document.activeElement) && document.activeElement.tagName === "INPUT";
  }

  async function refresh() {
    timer = null;
    if (document.visibilityState !== "visible" || !running()) {
      return;
    }
    // Typing a cancel or pause reason must not be wiped by a refresh, nor by one
    // whose answer arrives after the typing began.
    if (typing()) {
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
        const text = await response.text();
        if (typing()) {
          schedule();
          return;
        }
        live.innerHTML = text;
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

// Pages with regions marked data-refresh (runs, health, activity, workers) fetch
// themselves again every interval and swap those regions in place, keeping their
// size where they can so the page does not jump. Paused while the tab is hidden,
// while a box on the page is ticked (a selection must survive) and while the
// operator types in a region.
function refreshRegions(regions) {
  const interval = Math.max(1000, Number(document.body.dataset.intervalMs) || 2000);
  let timer = null;

  function busy() {
    const active = document.activeElement;
    const typing = active !== null && ["INPUT", "SELECT", "TEXTAREA"].includes(active.tagName)
      && regions.some((region) => region.contains(active));
    const ticked = document.querySelector('input[type="checkbox"]:checked') !== null;
    const open = document.querySelector("details[open]") !== null;
    return typing || ticked || open;
  }

  async function refresh() {
    timer = null;
    if (document.visibilityState !== "visible") {
      return;
    }
    if (!busy()) {
      try {
        const response = await fetch(window.location.href, {
          credentials: "same-origin",
          headers: { Accept: "text/html" },
        });
        if (response.ok) {
          const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
          for (const region of regions) {
            const found = fresh.getElementById(region.id);
            if (found !== null && found.innerHTML !== region.innerHTML) {
              region.innerHTML = found.innerHTML;
            }
          }
          document.dispatchEvent(new CustomEvent("jobrun:refreshed"));
        }
      } catch (error) {
        // The server may be restarting: try again at the next tick.
      }
    }
    schedule();
  }

  function schedule() {
    if (timer === null && document.visibilityState === "visible") {
      timer = window.setTimeout(refresh, interval);
    }
  }

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState !== "visible" && timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    } else {
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
  // Delegated: the box may be swapped in by a refresh.
  document.addEventListener("change", (event) => {
    const all = event.target;
    if (all.id !== "select-all") {
      return;
    }
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
  const regions = Array.from(document.querySelectorAll("[data-refresh][id]"));
  if (regions.length > 0) {
    refreshRegions(regions);
  }
  confirmForms();
  selectAll();
});
