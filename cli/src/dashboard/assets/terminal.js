// k8s4r dashboard: a terminal in a running task (its page offers it to a
// user who may exec). xterm.js draws it; a WebSocket to the dashboard
// carries it, in Kubernetes' channel protocol: the first byte of a binary
// message is its channel (0 keys, 1 output, 4 sizes). The end comes as
// one text message: {"exit": N} or {"error": "..."}.
"use strict";

(() => {
  const form = document.getElementById("term-form");
  const box = document.getElementById("terminal");
  if (!form || !box || typeof Terminal === "undefined") return;
  const status = document.getElementById("term-status");
  const open = document.getElementById("term-open");
  const close = document.getElementById("term-close");
  const say = (text) => { status.textContent = text; };
  const STDIN = 0, STDOUT = 1, RESIZE = 4;
  const encoder = new TextEncoder();
  let session = null;

  // A terminal opens while the task runs; the page's live part says so.
  function runningNow() {
    const now = document.getElementById("attempt-now");
    return !!now && now.dataset.phase === "running";
  }
  function offer() {
    if (session) return;
    open.disabled = !runningNow();
    if (open.disabled && !status.textContent) say("A terminal opens while the task runs.");
    if (!open.disabled && status.textContent === "A terminal opens while the task runs.") say("");
  }
  offer();
  document.addEventListener("k8s4r:refreshed", offer);

  // The command's words, quoted as in a shell ('…', "…", \); null when
  // a quote is left open.
  function wordsOf(text) {
    const out = [];
    let word = null;
    let quote = null;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (quote) {
        if (c === quote) quote = null;
        else if (c === "\\" && quote === '"' && i + 1 < text.length) word += text[++i];
        else word += c;
      } else if (c === "'" || c === '"') {
        quote = c;
        word = word === null ? "" : word;
      } else if (c === "\\" && i + 1 < text.length) {
        word = (word === null ? "" : word) + text[++i];
      } else if (/\s/.test(c)) {
        if (word !== null) { out.push(word); word = null; }
      } else {
        word = (word === null ? "" : word) + c;
      }
    }
    if (quote) return null;
    if (word !== null) out.push(word);
    return out;
  }

  function start(words) {
    box.hidden = false;
    box.textContent = "";
    const term = new Terminal({ cursorBlink: true, scrollback: 5000, fontSize: 14, lineHeight: 1.2 });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const query = new URLSearchParams();
    for (const w of words) query.append("command", w);
    query.set("width", term.cols);
    query.set("height", term.rows);
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + box.dataset.url + "?" + query);
    ws.binaryType = "arraybuffer";
    const send = (channel, bytes) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const message = new Uint8Array(bytes.length + 1);
      message[0] = channel;
      message.set(bytes, 1);
      ws.send(message);
    };
    const subscriptions = [
      term.onData((data) => send(STDIN, encoder.encode(data))),
      term.onBinary((data) => send(STDIN, Uint8Array.from(data, (c) => c.charCodeAt(0)))),
      term.onResize(({ cols, rows }) => send(RESIZE, encoder.encode(JSON.stringify({ Width: cols, Height: rows })))),
    ];
    const refit = () => fit.fit();
    window.addEventListener("resize", refit);
    let told = false;
    ws.onopen = () => { say("Running " + words.join(" ") + "."); term.focus(); };
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        const end = JSON.parse(e.data);
        told = true;
        say(end.error ? end.error : "The command exited with status " + end.exit + ".");
        return;
      }
      const bytes = new Uint8Array(e.data);
      if (bytes.length > 1 && bytes[0] === STDOUT) term.write(bytes.subarray(1));
    };
    ws.onclose = () => {
      if (!told) say("The terminal's connection was lost.");
      window.removeEventListener("resize", refit);
      for (const s of subscriptions) s.dispose();
      term.options.disableStdin = true;
      term.options.cursorBlink = false;
      session = null;
      close.hidden = true;
      open.hidden = false;
      offer();
    };
    session = { ws, term };
    window.k8s4rTerminal = term;
    close.hidden = false;
    open.hidden = true;
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (session || !runningNow()) return;
    const words = wordsOf(document.getElementById("term-command").value);
    if (words === null) { say("A quote in the command is not closed."); return; }
    if (!words.length) { say("Name the command to run, such as sh."); return; }
    if (window.k8s4rTerminal) window.k8s4rTerminal.dispose();
    say("Connecting…");
    start(words);
  });
  close.addEventListener("click", () => { if (session) session.ws.close(); });
})();
