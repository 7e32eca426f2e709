// Promise.withResolvers (Node.js 22) for Node.js 20: gossipsub's peer store takes its locks through it-queue, which
// calls it. Imported first by the scripts that start those services.
if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject
    const promise = new Promise((resolveWith, rejectWith) => { resolve = resolveWith; reject = rejectWith })
    return { promise, resolve, reject }
  }
}
