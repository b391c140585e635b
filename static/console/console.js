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
  // 4401: this session was signed out (elsewhere, or by an admin). The socket does not come
  // back, so say so once, calmly, with the way to sign in again.
  function showSignedOut() {
    setLive("closed", "Signed out");
    if (document.getElementById("signed-out")) return;
    const notice = document.createElement("div");
    notice.id = "signed-out";
    notice.className = "callout neutral";
    notice.setAttribute("role", "alert");
    const text = document.createElement("strong");
    text.textContent = "You were signed out. ";
    const link = document.createElement("a");
    link.href = "/login/?next=" + encodeURIComponent(location.pathname + location.search);
    link.textContent = "Sign in again";
    notice.append(text, link);
    const main = document.getElementById("main");
    if (main) main.prepend(notice);
  }
  body.addEventListener("htmx:wsClose", (event) => {
    const code = event.detail && event.detail.event ? event.detail.event.code : 0;
    if (code === 4401) showSignedOut();
    else setLive("closed", "Offline: reload to refresh");
  });
  body.addEventListener("htmx:wsError", () => setLive("closed", "Offline: reload to refresh"));
  // Hints come in bursts: one re-read per burst, and a burst of delivery hints alone re-reads
  // only the delivery logs ("console:deliveries"), not the queue or the ticket.
  const pending = new Set();
  body.addEventListener("htmx:wsAfterMessage", (event) => {
    const kind = (/data-kind="([^"]*)"/.exec(event.detail.message || "") || [])[1] || "";
    pending.add(kind === "delivery.changed" ? "console:deliveries" : "console:changed");
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      pending.forEach((name) => body.dispatchEvent(new CustomEvent(name)));
      pending.clear();
    }, 120);
  });
  if (!window.htmx || !window.WebSocket) setLive("closed", "Reload to refresh");

  // A press and its release: what a live re-read must not move in between. What a press held
  // back goes out at its release, or HOLD_MS after the press when the page never sees the
  // release (a native select's popup or a context menu takes it); a longer press holds nothing.
  const HOLD_MS = 2000;
  let pressedAt = 0;
  let holdTimer = null;
  let heldBack = new Set();
  let staleHeld = new Set();
  function pressing() {
    return pressedAt !== 0 && Date.now() - pressedAt < HOLD_MS;
  }
  document.addEventListener("pointerdown", () => {
    pressedAt = Date.now();
    clearTimeout(holdTimer);
    holdTimer = setTimeout(released, HOLD_MS);
  }, true);
  function released() {
    clearTimeout(holdTimer);
    holdTimer = null;
    pressedAt = 0;
    const names = heldBack;
    const notices = staleHeld;
    heldBack = new Set();
    staleHeld = new Set();
    // After the click this release makes, which goes where the press was.
    setTimeout(() => {
      notices.forEach((elt) => { if (elt.isConnected) showStale(elt); });
      names.forEach((name) => body.dispatchEvent(new CustomEvent(name)));
    }, 0);
  }
  document.addEventListener("pointerup", released, true);
  document.addEventListener("pointercancel", released, true);
  window.addEventListener("blur", released);

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
  function liveReread(elt, trigger) {
    return elt && elt.id === "decision" && trigger && trigger.type === "console:changed";
  }
  // The notice pushes the decision's buttons down: shown during a press, it would move the
  // button from under the pointer and the click would be lost (where a press focuses the
  // button, as in Chromium, a press on Approve is itself what makes the form busy). It waits
  // for the release.
  function showStale(elt) {
    if (pressing()) {
      staleHeld.add(elt);
      return;
    }
    const notice = elt.querySelector("#decision-stale");
    if (notice) notice.hidden = false;
  }
  body.addEventListener("htmx:confirm", (event) => {
    const elt = event.detail.elt;
    if (!liveReread(elt, event.detail.triggeringEvent) || !decisionBusy(elt)) return;
    event.preventDefault();
    showStale(elt);
  });
  // The re-read may have left before the person started typing: check again before it lands.
  body.addEventListener("htmx:beforeSwap", (event) => {
    const config = event.detail.requestConfig;
    const elt = config && config.elt;
    if (!liveReread(elt, config.triggeringEvent) || !decisionBusy(elt)) return;
    event.detail.shouldSwap = false;
    showStale(elt);
  });
  // Nor between a press and its release: the pressed link would be swapped for its new copy
  // under the pointer and the click lost (a row clicked just as the page's socket opens). The
  // re-read waits for the release, then reads again.
  body.addEventListener("htmx:beforeSwap", (event) => {
    const config = event.detail.requestConfig;
    const trigger = config && config.triggeringEvent;
    const live = trigger && (trigger.type === "console:changed" || trigger.type === "console:deliveries");
    if (!live || !pressing() || !event.detail.shouldSwap) return;
    event.detail.shouldSwap = false;
    heldBack.add(trigger.type);
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
    // A rejection's confirmation holds its message to the agent, focused, so `r` and a click
    // both lead to one place to write it; it goes back into the form's field on confirm.
    const source = button.dataset.confirmMessage && document.getElementById(button.dataset.confirmMessage);
    let note = null;
    if (source) {
      const label = document.createElement("label");
      label.htmlFor = "confirm-message";
      label.textContent = "Message to the agent";
      note = document.createElement("textarea");
      note.id = "confirm-message";
      note.rows = 3;
      note.maxLength = source.maxLength > 0 ? source.maxLength : 2000;
      note.placeholder = source.placeholder;
      note.value = source.value;
      dialog.append(label, note);
    }
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
    dialog.prepend(text);
    dialog.append(actions);
    document.body.append(dialog);
    cancel.addEventListener("click", () => dialog.close());
    ok.addEventListener("click", () => {
      dialog.close();
      // The panel may have been re-read meanwhile: submit the button that is on the page now.
      const current = (button.dataset.key && document.querySelector(`#decide-form button[data-key="${button.dataset.key}"]`)) || button;
      if (!current.form) return;
      confirmed = current;
      const field = note && current.dataset.confirmMessage && document.getElementById(current.dataset.confirmMessage);
      if (field) field.value = note.value;
      // htmx does not always see the submitter, so the choice also travels in a hidden field.
      const hidden = current.form.querySelector("input[data-decision]");
      if (hidden) hidden.value = current.value;
      current.form.requestSubmit(current);
    });
    dialog.addEventListener("close", () => dialog.remove());
    dialog.showModal();
    (note || ok).focus();
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

  // --- batch decisions: tick pending rows of one tool, then approve or reject them together ---
  // Ticks live in a set, because a live re-read of the rows redraws their checkboxes.
  const batchForm = document.getElementById("batch-form");
  const picked = new Set();
  function batchBoxes() {
    return Array.from(document.querySelectorAll('input[type="checkbox"][form="batch-form"]'));
  }
  function syncBatch() {
    if (!batchForm) return;
    const boxes = batchBoxes();
    const present = new Set(boxes.map((box) => box.value));
    // A ticket gone from the page (decided, expired) leaves the selection.
    Array.from(picked).forEach((id) => { if (!present.has(id)) picked.delete(id); });
    boxes.forEach((box) => { box.checked = picked.has(box.value); });
    const chosen = boxes.find((box) => box.checked);
    const tool = chosen ? chosen.dataset.tool : "";
    // One tool per batch: the server refuses a mix, so the page does not offer one.
    boxes.forEach((box) => {
      box.disabled = Boolean(tool) && box.dataset.tool !== tool;
      box.title = box.disabled ? `Only ${tool} tickets can join this batch` : "";
    });
    const count = picked.size;
    const noun = `${count} ${tool} ticket${count === 1 ? "" : "s"}`;
    batchForm.querySelector("#batch-count").textContent = count
      ? `${count} selected (${tool}):`
      : "Tick pending tickets of one tool to decide them together.";
    batchForm.querySelectorAll("button[data-batch]").forEach((button) => {
      button.disabled = count === 0;
      button.dataset.confirm = button.value === "approve"
        ? `Approve ${noun}? Each is checked and decided on its own.`
        : `Reject ${noun}? The message goes back to each agent.`;
    });
  }
  function toggle(box) {
    if (!box || box.disabled) return;
    box.checked = !box.checked;
    box.dispatchEvent(new Event("change", { bubbles: true }));
  }
  document.addEventListener("change", (event) => {
    const box = event.target.closest('input[type="checkbox"][form="batch-form"]');
    if (!box) return;
    if (box.checked) picked.add(box.value); else picked.delete(box.value);
    syncBatch();
  });
  body.addEventListener("htmx:afterSettle", syncBatch);
  if (batchForm) {
    batchForm.addEventListener("htmx:afterRequest", (event) => {
      if (event.detail.successful) { picked.clear(); syncBatch(); }
    });
  }
  syncBatch();

  // --- keyboard: j/k move in a list, Enter opens, x ticks; a/r decide and c claims on a ticket ---
  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }
  function rows() {
    return Array.from(document.querySelectorAll("[data-keyboard-list] [data-row]"));
  }
  // The cursor is kept by row id, because a live re-read of the list redraws its rows.
  let cursor = null;
  function mark(row, focus) {
    rows().forEach((other) => other.classList.toggle("selected", other === row));
    const link = row && row.querySelector("a.row-link");
    // A re-read must not scroll the page to the row; j and k scroll it into view themselves.
    if (link && focus) link.focus({ preventScroll: true });
  }
  function select(index) {
    const all = rows();
    if (!all.length) return;
    const row = all[Math.max(0, Math.min(index, all.length - 1))];
    cursor = row.id;
    mark(row, true);
    row.scrollIntoView({ block: "nearest" });
  }
  function selectedIndex() {
    return cursor === null ? -1 : rows().findIndex((row) => row.id === cursor);
  }
  // Focus goes with a redrawn link: remember whether it was in the list, to put it back.
  let focusInList = false;
  body.addEventListener("htmx:beforeSwap", (event) => {
    const target = event.detail.target;
    // A swap held back above changes nothing, so nothing is to be put back.
    if (!event.detail.shouldSwap) return;
    if (target && target.querySelector("[data-keyboard-list]")) {
      focusInList = target.contains(document.activeElement);
    }
  });
  body.addEventListener("htmx:afterSettle", () => {
    const refocus = focusInList;
    focusInList = false;
    if (cursor === null) return;
    const row = document.getElementById(cursor);
    // The row left the list (decided, expired): the cursor goes back to the top.
    if (!row || !row.matches("[data-keyboard-list] [data-row]")) { cursor = null; mark(null, false); return; }
    mark(row, refocus);
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !event.ctrlKey && !event.metaKey && !event.altKey) {
      // Escape closes an open confirmation (even from its message field), else leaves a field.
      const open = document.querySelector("dialog[open]");
      if (open) { event.preventDefault(); open.close(); }
      else if (typing(event.target)) { event.preventDefault(); event.target.blur(); }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (document.querySelector("dialog[open]")) return;
    if (event.key === "j") { select(selectedIndex() + 1); event.preventDefault(); }
    else if (event.key === "k") { select(Math.max(selectedIndex() - 1, 0)); event.preventDefault(); }
    else if (event.key === "Enter" && selectedIndex() >= 0 && !event.target.closest("a, button")) {
      const link = rows()[selectedIndex()].querySelector("a.row-link");
      if (link) link.click();
    } else if (event.key === "x" && selectedIndex() >= 0) {
      const box = rows()[selectedIndex()].querySelector('input[type="checkbox"][form="batch-form"]');
      if (box) { event.preventDefault(); toggle(box); }
    } else if (event.key === "c") {
      // Claim, or release one's own claim; taking over someone else's asks first, by click.
      const button = document.querySelector('#claim-form button[data-key="c"]');
      if (button) { event.preventDefault(); button.form.requestSubmit(button); }
    } else if (event.key === "a" || event.key === "r") {
      const button = document.querySelector(`#decide-form button[data-key="${event.key}"]`);
      if (button) {
        event.preventDefault();
        confirmThen(button);
      }
    }
  });
  document.addEventListener("click", (event) => {
    const row = event.target.closest("[data-keyboard-list] [data-row]");
    // A click on a row opens it, except on its own controls (links, the batch checkbox).
    if (!row || event.target.closest("a, button, input, label, td.pick")) return;
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

  // --- copy a secret shown once (an API token) to the clipboard ---
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    const status = document.querySelector(`[data-copy-status="${button.dataset.copy}"]`);
    const say = (text) => { if (status) status.textContent = text; };
    if (!source || !navigator.clipboard) { say("Select the token and copy it."); return; }
    navigator.clipboard.writeText(source.textContent.trim()).then(
      () => say("Copied."),
      () => say("Could not copy: select the token and copy it."),
    );
  });
})();
