// Accessible names Gradio leaves out (a checkbox or radio group is a fieldset without a
// legend; an output textbox's label is taken by its Copy button). Gradio also renders output
// textboxes disabled: unnamed, skipped by Tab, their text not selectable from the keyboard;
// read-only keeps them uneditable but reachable. A mutation observer, because Gradio renders
// (and re-renders) the page after this script runs.
(() => {
  const names = __ACCESSIBLE_NAMES__;
  const fix = () => {
    for (const [id, name] of Object.entries(names)) {
      const block = document.getElementById(id);
      const field = block && (block.matches("fieldset") ? block : block.querySelector("textarea, input"));
      if (!field) continue;
      if (field.getAttribute("aria-label") !== name) field.setAttribute("aria-label", name);
      if (field.disabled && field.tagName !== "FIELDSET") {
        field.disabled = false;
        field.readOnly = true;
      }
    }
  };
  new MutationObserver(fix).observe(document.documentElement, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["disabled"],
  });
})();
