// Every POST form of the pages is sent once per press: a second submit of a form already
// on its way is dropped, and its buttons look and are disabled until the answer comes (a
// page that stays put — the project page's fetch() forms — calls window.formSent(form,
// response) when it has the answer). The server holds the same rule with the form's
// one-time token (web/form_once.py); a fetch answer carries the form's next token.
(function () {
  "use strict";
  function buttons(form) {
    return [...form.querySelectorAll("button, input[type=submit]"),
            ...(form.id ? document.querySelectorAll(`[form="${form.id}"]`) : [])]
      .filter((b) => b.type === "submit" || b.tagName === "BUTTON" && !b.type);
  }
  function release(form) {
    delete form.dataset.sending;
    buttons(form).forEach((b) => { if (b.dataset.sendingOff) { b.disabled = false; delete b.dataset.sendingOff; } b.removeAttribute("aria-busy"); });
  }
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if ((form.getAttribute("method") || "").toLowerCase() !== "post") return;
    if (form.dataset.sending) { event.preventDefault(); event.stopImmediatePropagation(); return; }
    form.dataset.sending = "1";
    if (event.submitter) event.submitter.setAttribute("aria-busy", "true");
    // after this turn: the browser has read the pressed button's name and value by then
    setTimeout(() => {
      if (!form.dataset.sending) return;
      buttons(form).forEach((b) => { if (!b.disabled) { b.disabled = true; b.dataset.sendingOff = "1"; } });
    }, 0);
  }, true);
  window.formSent = function (form, response) {
    const next = response && response.headers && response.headers.get("X-Form-Token");
    const field = form.querySelector("input[name=form_token]");
    if (next && field) field.value = next;
    release(form);
  };
  // back to a page kept in the browser's cache: its forms can be sent again
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) document.querySelectorAll("form[data-sending]").forEach(release);
  });
})();
