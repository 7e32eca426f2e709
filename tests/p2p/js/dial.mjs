// A second libp2p implementation for tests/node/p2p/test_security.py: js-libp2p dials one multiaddr,
// offering only the connection encrypter named on the command line, and prints one JSON line:
// {"connected": true, "remotePeer": ...} or {"connected": false, "error": ...}.
//
//   node dial.mjs MULTIADDR plaintext|noise [CLAIMED_PUBLIC_KEY_HEX]
//
// With a claimed key (a compressed secp256k1 public key, hex), the plaintext exchange states that key
// instead of the dialer's own: the peer id a plaintext listener then believes it talks to, with no proof.
// Exit status 0 whether or not the dial succeeds; anything else means the script itself failed.
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { publicKeyFromRaw } from '@libp2p/crypto/keys'
import { plaintext } from '@libp2p/plaintext'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const TIMEOUT_MS = 5000
const [addr, encrypter, claimedHex] = process.argv.slice(2)
if (addr === undefined || !['plaintext', 'noise'].includes(encrypter) || (claimedHex && encrypter !== 'plaintext')) {
  console.error('usage: node dial.mjs MULTIADDR plaintext|noise [CLAIMED_PUBLIC_KEY_HEX (plaintext only)]')
  process.exit(2)
}

function claiming (publicKey) {
  // plaintext reads only `privateKey.publicKey` from its components: hand it the claimed key instead
  return (components) => plaintext()(new Proxy(components, {
    get: (target, name) => name === 'privateKey' ? { publicKey } : target[name]
  }))
}

const encrypters = {
  plaintext: claimedHex ? claiming(publicKeyFromRaw(Buffer.from(claimedHex, 'hex'))) : plaintext(),
  noise: noise()
}
const node = await createLibp2p({
  addresses: { listen: [] },
  transports: [tcp()],
  connectionEncrypters: [encrypters[encrypter]],
  streamMuxers: [yamux()]
})
let result
try {
  const connection = await node.dial(multiaddr(addr), { signal: AbortSignal.timeout(TIMEOUT_MS) })
  result = { connected: true, remotePeer: connection.remotePeer.toString() }
} catch (error) {
  result = { connected: false, error: `${error.name}: ${error.message}` }
}
console.log(JSON.stringify(result))
await node.stop()
process.exit(0)
