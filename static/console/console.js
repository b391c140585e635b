// Approval console: live hints, keyboard use, confirmations, countdowns. No inline script anywhere.
(function () {
  "use strict";

  const body = document.body;

  // --- live updates: a websocket message is a hint; live regions re-read their own URL ---
  const status = document.getElementById("live-status");
  function setLive(state, label) {
    if (!status) return;
    status.dataset.state = state;
    status.querySelector(".live-label").textContent = label;
    status.title = state === "open" ? "Live updates are on" : "Live updates are off: reload the page to see changes";
  }
  let refreshTimer = null;
  body.addEventListener("htmx:wsOpen", () => {
    setLive("open", "Live");
    // Whatever changed between drawing the page and this socket opening (or while it was
    // reconnecting) was not hinted to us: re-read once now.
    body.dispatchEvent(new CustomEvent("console:changed"));
  });
  body.addEventListener("htmx:wsClose", () => setLive("closed", "Offline: reload to refresh"));
  body.addEventListener("htmx:wsError", () => setLive("closed", "Offline: reload to refresh"));
  body.addEventListener("htmx:wsAfterMessage", () => {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => body.dispatchEvent(new CustomEvent("console:changed")), 120);
  });
  if (!window.htmx || !window.WebSocket) setLive("closed", "Reload to refresh");

  // A live re-read must never wipe a decision someone is writing: skip it, and say so.
  function decisionBusy(elt) {
    const form = elt.querySelector("#decide-form");
    if (!form) return false;
    const message = form.querySelector("textarea");
    const always = form.querySelector("input[name=always]");
    return Boolean(
      form.contains(document.activeElement) ||
        document.querySelector("dialog.confirm[open]") !== null ||
        (message && message.value.trim()) ||
        (always && always.checked)
    );
  }
  function keepDecision(elt) {
    const notice = elt.querySelector("#decision-stale");
    if (notice) notice.hidden = false;
  }
  body.addEventListener("htmx:confirm", (event) => {
    const elt = event.detail.elt;
    const trigger = event.detail.triggeringEvent;
    if (!elt || elt.id !== "decision" || !trigger || trigger.type !== "console:changed") return;
    if (decisionBusy(elt)) {
      event.preventDefault();
      keepDecision(elt);
    }
  });
  // The same check when the re-read comes back: typing may have started while it was on its way.
  body.addEventListener("htmx:beforeSwap", (event) => {
    const elt = event.detail.elt;
    const trigger = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent;
    if (!elt || elt.id !== "decision" || !trigger || trigger.type !== "console:changed") return;
    if (decisionBusy(elt)) {
      event.detail.shouldSwap = false;
      keepDecision(elt);
    }
  });

  // --- tenant switcher submits on change (a button is shown when scripts are off) ---
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });

  // --- confirmation before deciding ---
  let confirmed = null;
  function confirmThen(button) {
    const dialog = document.createElement("dialog");
    dialog.className = "confirm";
    const text = document.createElement("p");
    text.textContent = button.dataset.confirm;
    const actions = document.createElement("div");
    actions.className = "actions";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "button ghost";
    cancel.textContent = "Cancel";
    const ok = document.createElement("button");
    ok.type = "button";
    ok.className = button.className;
    ok.textContent = button.textContent.trim();
    actions.append(cancel, ok);
    dialog.append(text, actions);
    document.body.append(dialog);
    cancel.addEventListener("click", () => dialog.close());
    ok.addEventListener("click", () => {
      dialog.close();
      // The panel may have been re-read meanwhile: submit the button that is on the page now.
      const current = (button.dataset.key && document.querySelector(`#decide-form button[data-key="${button.dataset.key}"]`)) || button;
      if (!current.form) return;
      confirmed = current;
      // htmx does not always see the submitter, so the choice also travels in a hidden field.
      const hidden = current.form.querySelector("input[data-decision]");
      if (hidden) hidden.value = current.value;
      current.form.requestSubmit(current);
    });
    dialog.addEventListener("close", () => dialog.remove());
    dialog.showModal();
    ok.focus();
  }
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-confirm]");
    if (!button || confirmed === button) {
      confirmed = null;
      return;
    }
    event.preventDefault();
    confirmThen(button);
  });

  // --- keyboard: j/k move in a list, Enter opens; a/r decide on a ticket ---
  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }
  function rows() {
    return Array.from(document.querySelectorAll("[data-keyboard-list] [data-row]"));
  }
  function select(index) {
    const all = rows();
    if (!all.length) return;
    const clamped = Math.max(0, Math.min(index, all.length - 1));
    all.forEach((row) => row.classList.remove("selected"));
    all[clamped].classList.add("selected");
    const link = all[clamped].querySelector("a.row-link");
    if (link) link.focus();
  }
  function selectedIndex() {
    return rows().findIndex((row) => row.classList.contains("selected"));
  }
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (document.querySelector("dialog[open]")) return;
    if (event.key === "j") { select(selectedIndex() + 1); event.preventDefault(); }
    else if (event.key === "k") { select(Math.max(selectedIndex() - 1, 0)); event.preventDefault(); }
    else if (event.key === "Enter" && selectedIndex() >= 0 && !event.target.closest("a, button")) {
      const link = rows()[selectedIndex()].querySelector("a.row-link");
      if (link) link.click();
    } else if (event.key === "a" || event.key === "r") {
      const button = document.querySelector(`#decide-form button[data-key="${event.key}"]`);
      if (button) {
        event.preventDefault();
        if (event.key === "r") {
          const message = document.getElementById("id_message");
          if (message && !message.value.trim()) { message.focus(); return; }
        }
        confirmThen(button);
      }
    }
  });
  document.addEventListener("click", (event) => {
    const row = event.target.closest("[data-keyboard-list] [data-row]");
    if (!row || event.target.closest("a, button")) return;
    const link = row.querySelector("a.row-link");
    if (link) link.click();
  });

  // --- countdowns to expiry, refreshed every 30 seconds ---
  function span(seconds) {
    const minutes = Math.floor(seconds / 60), hours = Math.floor(minutes / 60), days = Math.floor(hours / 24);
    if (days) return `${days}d ${hours % 24}h`;
    if (hours) return `${hours}h ${minutes % 60}m`;
    return minutes ? `${minutes}m` : "under a minute";
  }
  function tick() {
    document.querySelectorAll("time[data-countdown]").forEach((el) => {
      const left = Math.floor((Date.parse(el.getAttribute("datetime")) - Date.now()) / 1000);
      el.textContent = left > 0 ? `in ${span(left)}` : "expired";
      el.classList.toggle("expired", left <= 0);
    });
  }
  setInterval(tick, 30000);
})();
