// Renders the API reference at /docs from the spec this server serves, with the vendored
// Redoc. It is a file of its own, not an inline script, because the page's
// Content-Security-Policy allows scripts from the server's own files only.
"use strict";

(function () {
  const root = document.getElementById("redoc");
  const failed = (msg) => {
    const el = document.getElementById("docs-error");
    el.textContent = "The API reference could not be rendered: " + msg;
    el.hidden = false;
  };
  if (typeof Redoc === "undefined") {
    failed("the Redoc bundle did not load.");
    return;
  }
  Redoc.init("/openapi.yaml", {
    // Redoc's search runs in a worker made from a blob: URL, which the policy's worker-src
    // (falling back to script-src 'self') does not allow; the browser's find does the job.
    disableSearch: true,
    expandResponses: "200,201",
    hideHostname: false,
    nativeScrollbars: true,
    sortPropsAlphabetically: false,
  }, root, (err) => {
    if (err) failed(String(err && err.message ? err.message : err));
    else document.body.dataset.rendered = "true";
  });
})();
