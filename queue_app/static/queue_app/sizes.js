// Sizes said to people, as queue_app/sizes.py says them: units of 1024 named KB, MB, GB,
// one decimal below 10 and none where it is whole ("1.5 KB", "20 MB", never "0.0 MB").
window.formatBytes = function (value) {
  let size = Math.max(0, Math.floor(Number(value) || 0));
  if (size < 1024) return `${size} byte${size === 1 ? "" : "s"}`;
  const units = ["KB", "MB", "GB", "TB"];
  let i = -1;
  do { size /= 1024; i += 1; } while (size >= 1024 && i < units.length - 1);
  const text = size < 10 ? size.toFixed(1).replace(/\.0$/, "") : size.toFixed(0);
  return `${text} ${units[i]}`;
};
