#!/usr/bin/env node
// Compiles contracts/src with the pinned solcjs and writes contracts/artifacts/<Name>.json.
// `node build.js --check` compiles in memory and exits 1 if any committed artifact differs.
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const ROOT = __dirname;
const SRC = path.join(ROOT, "src");
const OUT = path.join(ROOT, "artifacts");
const CONTRACTS = ["StakeToken", "NodeRegistry", "ComputePool", "WorkLedger"];
const SETTINGS = {
  optimizer: { enabled: true, runs: 10000 },
  evmVersion: "cancun",
  outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
};

function listSources(dir) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return listSources(full);
    return entry.name.endsWith(".sol") ? [full] : [];
  });
}

function findImport(importPath) {
  const candidates = [path.join(ROOT, "node_modules", importPath), path.join(SRC, importPath)];
  for (const file of candidates) {
    if (fs.existsSync(file)) return { contents: fs.readFileSync(file, "utf8") };
  }
  return { error: `import not found: ${importPath}` };
}

function compile() {
  const sources = {};
  for (const file of listSources(SRC).sort()) {
    sources[path.relative(SRC, file)] = { content: fs.readFileSync(file, "utf8") };
  }
  const input = { language: "Solidity", sources, settings: SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  for (const e of output.errors || []) {
    // report our own warnings; OpenZeppelin's are not ours to fix
    if (e.severity === "error" || !(e.sourceLocation && e.sourceLocation.file.startsWith("@"))) {
      process.stderr.write(`${e.formattedMessage}\n`);
    }
  }
  if (errors.length) throw new Error(`solc reported ${errors.length} error(s)`);

  // Every source solc read, ours and OpenZeppelin's, goes into the hash, so a dependency bump shows too.
  const hash = crypto.createHash("sha256");
  for (const name of Object.keys(output.sources).sort()) {
    const content = sources[name] ? sources[name].content : findImport(name).contents;
    hash.update(name).update("\0").update(content).update("\0");
  }
  const sourceHash = `0x${hash.digest("hex")}`;

  const artifacts = {};
  for (const name of CONTRACTS) {
    const unit = `${name}.sol`;
    const compiled = output.contracts[unit] && output.contracts[unit][name];
    if (!compiled) throw new Error(`no output for ${unit}:${name}`);
    const artifact = {
      contractName: name,
      sourceName: `contracts/src/${unit}`,
      compiler: { name: "solc", version: solc.version(), settings: { optimizer: SETTINGS.optimizer, evmVersion: SETTINGS.evmVersion } },
      sourceHash,
      abi: compiled.abi,
      bytecode: `0x${compiled.evm.bytecode.object}`,
      deployedBytecode: `0x${compiled.evm.deployedBytecode.object}`,
    };
    artifacts[name] = `${JSON.stringify(artifact, null, 2)}\n`;
  }
  return artifacts;
}

function main() {
  const check = process.argv.includes("--check");
  const artifacts = compile();
  let stale = 0;
  for (const [name, text] of Object.entries(artifacts)) {
    const file = path.join(OUT, `${name}.json`);
    const committed = fs.existsSync(file) ? fs.readFileSync(file, "utf8") : null;
    if (check) {
      if (committed !== text) {
        process.stderr.write(`stale artifact: ${path.relative(process.cwd(), file)} differs from a fresh build\n`);
        stale += 1;
      }
    } else if (committed !== text) {
      fs.mkdirSync(OUT, { recursive: true });
      const tmp = `${file}.tmp`;
      fs.writeFileSync(tmp, text);
      fs.renameSync(tmp, file);
      process.stdout.write(`wrote ${path.relative(process.cwd(), file)}\n`);
    }
  }
  if (stale) process.exit(1);
  process.stdout.write(`${check ? "checked" : "built"} ${CONTRACTS.length} contracts with solc ${solc.version()}\n`);
}

main();
