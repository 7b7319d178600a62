// Drives a running skein server with the official `openai` npm package (gateway/openai_test.go
// runs it: TestOpenAINodeSDK). Environment: SKEIN_URL (…/v1), SKEIN_KEY, SKEIN_BASE_MODEL,
// SKEIN_ADAPTER (an alias from /v1/models), SKEIN_QUESTION and SKEIN_ANSWER (what the adapter was
// trained to answer). NODE_PATH must hold the package. Prints "ok" and exits 0 when all hold.
'use strict';
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default;

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function chat(client, model, stream) {
  const req = {
    model,
    messages: [{ role: 'user', content: env('SKEIN_QUESTION') }],
    temperature: 0,
    max_tokens: 24,
  };
  if (!stream) {
    const c = await client.chat.completions.create(req);
    check(c.object === 'chat.completion' && c.choices.length === 1, `chat answer ${JSON.stringify(c)}`);
    check(c.usage && c.usage.completion_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens,
      `usage ${JSON.stringify(c.usage)}`);
    return { text: c.choices[0].message.content, finish: c.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create({ ...req, stream: true });
  let text = '';
  let finish = null;
  let chunks = 0;
  for await (const chunk of s) {
    check(chunk.object === 'chat.completion.chunk', `chunk ${JSON.stringify(chunk)}`);
    chunks++;
    for (const ch of chunk.choices) {
      if (ch.delta && ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check(chunks >= 2, `only ${chunks} chunks`);
  return { text, finish };
}

async function main() {
  const client = new OpenAI({ apiKey: env('SKEIN_KEY'), baseURL: env('SKEIN_URL'), maxRetries: 0 });
  const base = env('SKEIN_BASE_MODEL');
  const adapter = env('SKEIN_ADAPTER');
  const answer = env('SKEIN_ANSWER');

  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  check(ids.includes(base) && ids.includes(adapter), `models ${JSON.stringify(ids)}`);

  const baseWhole = await chat(client, base, false);
  const baseStream = await chat(client, base, true);
  check(baseWhole.text === baseStream.text, `base: streamed ${JSON.stringify(baseStream.text)}, whole ${JSON.stringify(baseWhole.text)}`);
  check(baseWhole.text !== answer, 'the base model already gives the trained answer: the test shows nothing');

  const tuned = await chat(client, adapter, false);
  check(tuned.text === answer && tuned.finish === 'stop', `adapter answered ${JSON.stringify(tuned)}, trained ${JSON.stringify(answer)}`);
  const tunedStream = await chat(client, adapter, true);
  check(tunedStream.text === answer && tunedStream.finish === 'stop', `adapter streamed ${JSON.stringify(tunedStream)}`);

  try {
    await client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
    throw new Error('an unknown model was answered');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found', `unknown model: ${e}`);
  }
  console.log('ok');
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
