// Reads a whole Durable Stream the way a new user of the official TypeScript client does,
// `stream({ url, live: false })`, and prints how many JSON messages it got and the offset it
// ended at (cli/tests/ds_catch_up.rs runs it).
import { stream } from "@durable-streams/client";

const url = process.argv[2];
const response = await stream({ url, live: false });
const items = await response.json();
console.log(JSON.stringify({ count: items.length, first: items[0], last: items.at(-1) }));
