// k8s4r dashboard: follows the cluster's changes and refetches the page's
// live part in place; follows a task's output. No framework, no inline code.
"use strict";

const live = document.getElementById("live");
const banner = document.getElementById("conn");

function showBanner(text) {
  if (!banner) return;
  if (text) banner.textContent = text;
  banner.hidden = false;
}

let refreshing = false;
let again = false;
async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  try {
    const r = await fetch(location.href, { headers: { "x-fragment": "1" }, cache: "no-store" });
    if (r.ok) {
      const focused = document.activeElement && document.activeElement.id;
      // A question a person opened (confirm a cancel) stays open.
      const open = [...live.querySelectorAll("details[open][id]")].map((d) => d.id);
      live.innerHTML = await r.text();
      for (const id of open) { const d = document.getElementById(id); if (d) d.open = true; }
      if (focused) { const el = document.getElementById(focused); if (el) el.focus(); }
      document.dispatchEvent(new CustomEvent("k8s4r:refreshed"));
    }
  } catch (e) {
    showBanner();
  } finally {
    refreshing = false;
    if (again) { again = false; refresh(); }
  }
}

if (live && live.dataset.watch) {
  const source = new EventSource("/live?watch=" + encodeURIComponent(live.dataset.watch));
  // Each (re)connection starts with a hello: what changed before the feed
  // was listening (between the page's render and now, or while the
  // connection was lost) is fetched then.
  source.addEventListener("hello", () => {
    banner.hidden = true;
    refresh();
  });
  source.addEventListener("changed", refresh);
  source.onerror = () => { showBanner("Connection to the dashboard lost: retrying…"); };
}

// A task's output: the current attempt's, followed while it runs. The live
// part says which attempt is current and whether it began (#attempt-now);
// when a retry makes a new one, the pane follows it without a reload.
const log = document.getElementById("log");
const logStatus = document.getElementById("log-status");
let reading = null;
function readLog() {
  const now = document.getElementById("attempt-now");
  if (!log || !now) return;
  const attempt = now.dataset.attempt;
  const phase = now.dataset.phase;
  const key = attempt + "/" + (phase === "waiting" ? "waiting" : "begun");
  if (reading && reading.key === key) {
    // The same attempt: a follow that was running goes on to its end.
    return;
  }
  if (reading) reading.source && reading.source.close();
  const say = (text) => { logStatus.textContent = text; };
  reading = { key, source: null };
  log.textContent = "";
  if (phase === "waiting") {
    say("Attempt " + attempt + " has not started yet: its output shows here once it runs.");
    return;
  }
  say("");
  const source = new EventSource(log.dataset.base + "?follow=" + (phase === "running"));
  reading.source = source;
  let done = false;
  source.addEventListener("out", (e) => {
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(document.createTextNode(JSON.parse(e.data)));
    if (atEnd) log.scrollTop = log.scrollHeight;
  });
  source.addEventListener("gap", (e) => {
    const mark = document.createElement("span");
    mark.className = "gap";
    mark.textContent = "[" + e.data + "]\n";
    log.append(mark);
  });
  // The robot could not be asked: what shows is the cluster's last output,
  // said in place to the end.
  let notice = null;
  source.addEventListener("notice", (e) => { notice = e.data; say(notice); });
  source.addEventListener("error", (e) => {
    if (e.data) { say(e.data); done = true; source.close(); }
  });
  source.addEventListener("end", () => {
    done = true;
    say(notice ? notice + ". The robot holds the rest." : "End of output.");
    source.close();
  });
  source.addEventListener("cut", () => {
    done = true; source.close();
    say("The output was cut off before its end: reload to read it again.");
  });
  source.onerror = () => { if (!done) say("Output connection lost: retrying…"); };
}
if (log) {
  readLog();
  document.addEventListener("k8s4r:refreshed", readLog);
}

// Relative ages ("5m ago") stay true without a refetch.
function ages() {
  for (const t of document.querySelectorAll("time[datetime]")) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(t.dateTime)) / 1000));
    t.textContent = (s < 120 ? s + "s" : s < 7200 ? Math.floor(s / 60) + "m"
      : s < 172800 ? Math.floor(s / 3600) + "h" : Math.floor(s / 86400) + "d") + " ago";
  }
}
setInterval(ages, 5000);
