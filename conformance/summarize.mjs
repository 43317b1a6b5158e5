// Prints the failing tests and one plain line: conformance: N passed, N failed, N skipped.
import { readFileSync } from "node:fs"
const r = JSON.parse(readFileSync(process.argv[2] ?? "conformance-results.json", "utf8"))
for (const f of r.testResults) for (const a of f.assertionResults)
  if (a.status === "failed") console.log(`FAILED: ${[...a.ancestorTitles, a.title].join(" > ")}`)
console.log(`conformance: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`)
process.exit(r.numFailedTests === 0 && r.numPendingTests + r.numTodoTests === 0 ? 0 : 1)
