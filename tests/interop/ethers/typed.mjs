// A second EIP-712 implementation for tests/interop/test_ethers.py: ethers.js, written from docs/signed-messages.md,
// not from our Python. Three commands, each printing one JSON document on stdout:
//
//   node typed.mjs check < cases.json
//     cases.json: [{"domain", "types", "primaryType", "message", "signature", "key"}, ...] (types without
//     EIP712Domain; uints as decimal strings, bytes as 0x-hex). For each case: {"hash": the EIP-712 digest,
//     "recovered": who signed "signature" over it, "signature": what "key" signs over it}, or {"error": ...}.
//
//   node typed.mjs grant CHAIN_ID CONTRACT < answer.json
//     answer.json: a coordinator's answer to POST /v1/tasks. Rebuilds the Assignment message from its JSON fields
//     with this file's own types (docs/signed-messages.md, "Assignments"); prints {"recovered": who signed it}.
//
//   node typed.mjs request URL POOL_ID CHAIN_ID CONTRACT KEY METHOD [BODY]
//     sends METHOD URL with BODY, signed by KEY as docs/signed-messages.md says (X-Prime-* headers over the
//     Request message), through Node's own HTTP client; prints {"status", "body"} of the answer.
//
// Exit status 0 whenever it could answer; anything else means the script itself failed.
import { TypedDataEncoder, Wallet, getBytes, hexlify, randomBytes, sha256, toUtf8Bytes, verifyTypedData } from 'ethers'

// docs/signed-messages.md, "Signed HTTP requests"
const REQUEST_TYPES = {
  Request: [
    { name: 'signer', type: 'address' },
    { name: 'method', type: 'string' },
    { name: 'path', type: 'string' },
    { name: 'bodyHash', type: 'bytes32' },
    { name: 'timestamp', type: 'uint64' },
    { name: 'nonce', type: 'bytes16' },
    { name: 'poolId', type: 'uint256' },
    { name: 'host', type: 'string' }
  ]
}

// docs/signed-messages.md, "Assignments": the fields in order, and the answer's JSON key of each
const ASSIGNMENT_FIELDS = [
  ['poolId', 'uint256', 'pool_id'],
  ['node', 'address', 'node'],
  ['step', 'uint64', 'step'],
  ['counter', 'uint64', 'counter'],
  ['prompts', 'uint32', 'prompts'],
  ['groupSize', 'uint32', 'group_size'],
  ['taskSpecHash', 'bytes32', 'task_spec_hash'],
  ['issuedAt', 'uint64', 'issued_at']
]
const ASSIGNMENT_TYPES = { Assignment: ASSIGNMENT_FIELDS.map(([name, type]) => ({ name, type })) }

function domainOf (chainId, verifyingContract) {
  return { name: 'PrimeNode', version: '1', chainId, verifyingContract }
}

async function readStdin () {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  return Buffer.concat(chunks).toString('utf8')
}

async function check () {
  const cases = JSON.parse(await readStdin())
  const answers = []
  for (const c of cases) {
    try {
      answers.push({
        hash: TypedDataEncoder.hash(c.domain, c.types, c.message),
        recovered: verifyTypedData(c.domain, c.types, c.message, c.signature),
        signature: await new Wallet(c.key).signTypedData(c.domain, c.types, c.message)
      })
    } catch (error) {
      answers.push({ error: String(error.shortMessage || error.message || error) })
    }
  }
  return answers
}

async function grant (chainId, contract) {
  const answer = JSON.parse(await readStdin())
  const message = Object.fromEntries(ASSIGNMENT_FIELDS.map(([name, , key]) => [name, answer[key]]))
  return { recovered: verifyTypedData(domainOf(chainId, contract), ASSIGNMENT_TYPES, message, answer.signature) }
}

async function request (url, poolId, chainId, contract, key, method, body = '') {
  const wallet = new Wallet(key)
  const target = new URL(url)
  const bytes = toUtf8Bytes(body)
  const message = {
    signer: wallet.address,
    method,
    path: target.pathname + target.search,
    bodyHash: sha256(bytes),
    timestamp: Math.floor(Date.now() / 1000),
    nonce: hexlify(randomBytes(16)),
    poolId,
    host: target.host
  }
  const signature = await wallet.signTypedData(domainOf(chainId, contract), REQUEST_TYPES, message)
  const headers = {
    'X-Prime-Address': wallet.address,
    'X-Prime-Signature': signature,
    'X-Prime-Timestamp': String(message.timestamp),
    'X-Prime-Nonce': message.nonce
  }
  const answer = await fetch(url, { method, headers, body: method === 'GET' ? undefined : getBytes(bytes) })
  const text = await answer.text()
  let parsed
  try {
    parsed = JSON.parse(text)
  } catch {
    parsed = text
  }
  return { status: answer.status, body: parsed }
}

const [command, ...args] = process.argv.slice(2)
if (command === 'check' && args.length === 0) {
  console.log(JSON.stringify(await check()))
} else if (command === 'grant' && args.length === 2) {
  console.log(JSON.stringify(await grant(...args)))
} else if (command === 'request' && (args.length === 6 || args.length === 7)) {
  console.log(JSON.stringify(await request(...args)))
} else {
  console.error('usage: node typed.mjs check < cases.json | node typed.mjs grant CHAIN_ID CONTRACT < answer.json | ' +
    'node typed.mjs request URL POOL_ID CHAIN_ID CONTRACT KEY METHOD [BODY]')
  process.exit(2)
}
