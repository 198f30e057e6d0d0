// The submit form's MIG profile offers the profiles of the pool chosen: the page carries a
// <datalist id="mig-profiles-pool-NAME"> per pool ("" for the GPUs in no pool); without one
// (a pool without MIG-capable GPUs) it offers none. The server still decides.
document.addEventListener("DOMContentLoaded", () => {
  const pool = document.getElementById("id_pool");
  const profile = document.getElementById("id_mig_profile");
  if (!pool || !profile) return;
  const follow = () => {
    const list = document.getElementById("mig-profiles-pool-" + pool.value);
    if (list) profile.setAttribute("list", list.id);
    else profile.removeAttribute("list");  // no MIG-capable GPU there
  };
  pool.addEventListener("change", follow);
  follow();
});
