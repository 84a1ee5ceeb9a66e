// The model chooser (#snippet-model) puts that model's snippets in place: each was
// written by the server for every model, with its values quoted for its language.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const chooser = document.getElementById("snippet-model");
  const byModel = JSON.parse(document.getElementById("snippets-by-model").textContent);
  chooser.addEventListener("change", () => {
    for (const [slug, text] of Object.entries(byModel[chooser.value])) {
      document.getElementById(`code-${slug}`).textContent = text;
    }
  });
});
