// llmgw dashboard: refresh the page's live parts in place, confirm destructive actions.
// The pages work without this file; it only saves the operator from reloading.
"use strict";
(() => {
  const every = parseFloat(document.body.dataset.refresh || "0") * 1000;

  // A region the operator is typing in, or has changed a field of, is left alone.
  function dirty(region) {
    for (const field of region.querySelectorAll("input, select, textarea")) {
      if (field.type === "hidden") continue;
      if (field.type === "checkbox" || field.type === "radio") {
        if (field.checked !== field.defaultChecked) return true;
      } else if (field.tagName === "SELECT") {
        for (const option of field.options) {
          if (option.selected !== option.defaultSelected) return true;
        }
      } else if (field.value !== field.defaultValue) {
        return true;
      }
    }
    return region.contains(document.activeElement) && document.activeElement !== document.body;
  }

  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const url = document.body.dataset.self || location.href;
      const response = await fetch(url, { credentials: "same-origin", redirect: "manual" });
      if (response.type === "opaqueredirect" || !response.ok) {
        document.body.classList.add("refresh-failed");
        return;
      }
      document.body.classList.remove("refresh-failed");
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const region of document.querySelectorAll("[data-live][id]")) {
        const next = fresh.getElementById(region.id);
        if (!next || dirty(region)) continue;
        // Keep the <details> the operator opened open.
        const open = new Set();
        region.querySelectorAll("details").forEach((d, i) => { if (d.open) open.add(i); });
        const copy = document.importNode(next, true);
        copy.querySelectorAll("details").forEach((d, i) => { d.open = open.has(i); });
        region.replaceWith(copy);
      }
    } catch (err) {
      document.body.classList.add("refresh-failed");
    } finally {
      busy = false;
    }
  }

  if (every > 0) setInterval(refresh, every);

  document.addEventListener("submit", (event) => {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
