// A "Copy" button (data-copy="<id>") copies the text of the element of that id.
"use strict";

async function copyText(source) {
  const text = "value" in source ? source.value : source.textContent;
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Plain HTTP on another host has no clipboard API: select the text and copy it.
  const selection = window.getSelection();
  const range = document.createRange();
  range.selectNodeContents(source);
  selection.removeAllRanges();
  selection.addRange(range);
  if ("select" in source) source.select();
  if (!document.execCommand("copy")) throw new Error("copy refused");
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  try {
    await copyText(source);
    button.textContent = "Copied";
  } catch (error) {
    button.textContent = "Select and copy by hand";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 2000);
});
