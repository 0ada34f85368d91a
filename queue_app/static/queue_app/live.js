// The live client of the project and job pages: one WebSocket per page on the project's
// events (web/live/consumers.py), configured by data attributes on the element whose
// content it keeps current:
//   data-live-project  the project whose socket it follows (/ws/projects/<id>/)
//   data-live-after    the event seq the page was rendered at: the socket replays from it
//   data-live-job      (optional) follow this one job's events only (the job page)
//   data-live-state    (optional) the id of the element that says "live" / "reconnecting…"
// An event updates its job's chip at once, then the element is re-rendered from the page's
// own URL with ?fragment=1 (debounced, one load at a time). A dropped socket reconnects
// with backoff from the last seq it saw, and the page polls its fragment until it is back.
// The element hears "live:reload" (load now), and tells "live:swapping" / "live:swapped"
// around each re-render, for page scripts that keep their own state across it.
(function () {
  "use strict";
  const DEBOUNCE_MS = 150, RETRY_FAILED_MS = 2000, POLL_MS = 5000, BACKOFF_FIRST_MS = 500, BACKOFF_MAX_MS = 10000;

  function start(root) {
    const projectId = root.dataset.liveProject, onlyJob = root.dataset.liveJob || "";
    const label = root.dataset.liveState ? document.getElementById(root.dataset.liveState) : null;
    let last = Number(root.dataset.liveAfter || 0);
    let retry = BACKOFF_FIRST_MS, fallback = null, pending = null, loading = false, again = false;
    const details = {};  // {job id: what its progress is of (ComfyUI: the node)}
    window.__liveSeen = window.__liveSeen || {};  // {job id: {status, at}}: what the socket told (tests read it)

    function say(text, live) {
      if (label) label.textContent = text;
      document.body.dataset.live = live ? "1" : "0";
    }

    // One load at a time: two in flight can answer out of order, and the older answer
    // would then stand over the newer one. An event during a load loads once more after
    // it; a load that fails is tried again, since no later event may come to try it.
    async function load() {
      if (loading) { again = true; return; }
      loading = true;
      let failed = true;
      try {
        const query = new URLSearchParams(location.search);
        query.set("fragment", "1");
        const response = await fetch(location.pathname + "?" + query, { credentials: "same-origin" });
        failed = response.status >= 500;
        if (response.ok && !response.redirected) swap(await response.text());
      } catch (e) { /* tried again below */ }
      loading = false;
      if (again || failed) { again = false; clearTimeout(pending); pending = setTimeout(load, failed ? RETRY_FAILED_MS : DEBOUNCE_MS); }
    }

    // The new content keeps what the user did to the old: ticked jobs, opened details.
    function swap(html) {
      const checked = new Set([...root.querySelectorAll("input[name=job]:checked")].map((i) => i.value));
      const open = [...root.querySelectorAll("details[open][data-job]")].map((d) => d.dataset.job);
      root.dispatchEvent(new CustomEvent("live:swapping"));
      root.innerHTML = html;
      root.querySelectorAll("input[name=job]").forEach((i) => { if (checked.has(i.value)) i.checked = true; });
      open.forEach((id) => { const d = root.querySelector(`details[data-job="${id}"]`); if (d) d.open = true; });
      root.dispatchEvent(new CustomEvent("live:swapped"));
      document.body.dataset.refreshed = String(Date.now());
    }

    function schedule() { clearTimeout(pending); pending = setTimeout(load, DEBOUNCE_MS); }

    // A job page follows its job, and what concerns the whole project (a ComfyUI
    // instance gone or back, the project finished): events without a job.
    function applyEvent(event) {
      if (onlyJob && event.job && event.job !== onlyJob) return;
      if (event.job && event.status) {
        window.__liveSeen[event.job] = { status: event.status, at: Date.now() };
        root.querySelectorAll(`[data-job="${event.job}"] .chip[data-status]`).forEach((chip) => {
          chip.textContent = event.status; chip.className = "chip " + event.status; chip.dataset.status = event.status;
        });
      }
      schedule();
    }

    function applyProgress(event) {
      if (onlyJob && event.job !== onlyJob) return;
      const percent = Math.round(100 * event.progress) + "%";
      const bar = root.querySelector(`[data-job="${event.job}"] .progress > i`);
      if (bar) bar.style.width = percent;
      // the relay's ticks (embedded set-up) carry no detail: the last one said stays
      if (event.detail) details[event.job] = event.detail;
      const text = root.querySelector(`[data-job="${event.job}"] [data-progress-label]`);
      if (text) text.textContent = percent + (details[event.job] ? " · " + details[event.job] : "");
    }

    function startFallback() { if (!fallback) fallback = setInterval(() => { if (!document.hidden) load(); }, POLL_MS); }
    function stopFallback() { clearInterval(fallback); fallback = null; }

    function connect() {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const ws = new WebSocket(`${scheme}://${location.host}/ws/projects/${projectId}/?after=${last}`);
      ws.onopen = () => { retry = BACKOFF_FIRST_MS; stopFallback(); say("live", true); };
      ws.onmessage = (message) => {
        const data = JSON.parse(message.data);
        if (data.type === "event") {
          if (data.seq <= last) return;
          last = data.seq;
          applyEvent(data);
        } else if (data.type === "resync") {
          last = data.seq;
          load();
        } else if (data.type === "progress") {
          applyProgress(data);
        }
      };
      ws.onclose = () => {
        say("reconnecting…", false);
        startFallback();
        setTimeout(connect, retry);
        retry = Math.min(retry * 2, BACKOFF_MAX_MS);
      };
    }

    root.addEventListener("live:reload", load);
    connect();
  }

  document.querySelectorAll("[data-live-project]").forEach(start);
})();
