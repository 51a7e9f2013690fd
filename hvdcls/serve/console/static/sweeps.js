// The sweep list: every 3 s this page's rows that changed (hvdcls.follow, rows.js).
"use strict";
(function () {
  const table = document.getElementById("sweeps");
  hvdcls.follow(table, "/console/sweeps.json", 3000, () => ({page: table.dataset.page}), update => {
    document.getElementById("total").textContent = update.total;
    document.getElementById("pages").textContent = update.pages;
  });
})();
