// Hardhat Network as a plain JSON-RPC node beside anvil: ledger/hardhat.py runs `hardhat node --config` on this.
// Anvil's chain id and its ten public development accounts, a block per transaction, the hardfork the artifacts are
// compiled for (build.js). Nothing is compiled here: build.js and the pinned solc make contracts/artifacts, and
// `paths` keeps Hardhat's own cache and artifacts away from them.
module.exports = {
  networks: {
    hardhat: {
      chainId: 31337,
      hardfork: "cancun",
      accounts: { mnemonic: "test test test test test test test test test test test junk", count: 10 },
      mining: { auto: true, interval: 0 },
      // A reverting transaction is mined and its hash returned, as on anvil and a real chain; Hardhat's default
      // answers eth_sendRawTransaction with an error, so a client would never see the mined failure.
      throwOnTransactionFailures: false,
    },
  },
  paths: {
    cache: "./node_modules/.cache/hardhat",
    artifacts: "./node_modules/.cache/hardhat/artifacts",
  },
};
