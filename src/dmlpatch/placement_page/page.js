// A marked line opens (or closes) the row below it, which gives the reasons in full.
document.querySelectorAll("tr.line").forEach(function (row) {
  function toggle() {
    var why = row.nextElementSibling;
    why.hidden = !why.hidden;
    row.setAttribute("aria-expanded", String(!why.hidden));
  }
  row.addEventListener("click", toggle);
  row.addEventListener("keydown", function (event) {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      toggle();
    }
  });
});
