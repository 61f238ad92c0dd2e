// Chat templates for models whose GGUF has none (no tokenizer.chat_template), by family. Each is
// the family's own template, byte for byte: test/chat-template.test.ts checks them against
// test/fixtures/chat-templates/*.jinja and those files' reference renderings.

/** Gemma 3's template (google/gemma-3-*-it); Gemma 1 and 2 use the same turns. */
export const GEMMA_TEMPLATE =
  "{{ bos_token }}\n"
  + "{%- if messages[0]['role'] == 'system' -%}\n"
  + "    {%- if messages[0]['content'] is string -%}\n"
  + "        {%- set first_user_prefix = messages[0]['content'] + '\n"
  + "\n"
  + "' -%}\n"
  + "    {%- else -%}\n"
  + "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
  + "\n"
  + "' -%}\n"
  + "    {%- endif -%}\n"
  + "    {%- set loop_messages = messages[1:] -%}\n"
  + "{%- else -%}\n"
  + "    {%- set first_user_prefix = \"\" -%}\n"
  + "    {%- set loop_messages = messages -%}\n"
  + "{%- endif -%}\n"
  + "{%- for message in loop_messages -%}\n"
  + "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
  + "        {{ raise_exception(\"Conversation roles must alternate user/assistant/use"
  + "r/assistant/...\") }}\n"
  + "    {%- endif -%}\n"
  + "    {%- if (message['role'] == 'assistant') -%}\n"
  + "        {%- set role = \"model\" -%}\n"
  + "    {%- else -%}\n"
  + "        {%- set role = message['role'] -%}\n"
  + "    {%- endif -%}\n"
  + "    {{ '<start_of_turn>' + role + '\n"
  + "' + (first_user_prefix if loop.first else \"\") }}\n"
  + "    {%- if message['content'] is string -%}\n"
  + "        {{ message['content'] | trim }}\n"
  + "    {%- elif message['content'] is iterable -%}\n"
  + "        {%- for item in message['content'] -%}\n"
  + "            {%- if item['type'] == 'image' -%}\n"
  + "                {{ '<start_of_image>' }}\n"
  + "            {%- elif item['type'] == 'text' -%}\n"
  + "                {{ item['text'] | trim }}\n"
  + "            {%- endif -%}\n"
  + "        {%- endfor -%}\n"
  + "    {%- else -%}\n"
  + "        {{ raise_exception(\"Invalid content type\") }}\n"
  + "    {%- endif -%}\n"
  + "    {{ '<end_of_turn>\n"
  + "' }}\n"
  + "{%- endfor -%}\n"
  + "{%- if add_generation_prompt -%}\n"
  + "    {{'<start_of_turn>model\n"
  + "'}}\n"
  + "{%- endif -%}\n";

/** Meta Llama 3 Instruct's template. */
export const LLAMA3_TEMPLATE =
  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set conte"
  + "nt = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message["
  + "'content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos"
  + "_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prom"
  + "pt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/** Plain ChatML, the turns of Qwen 2 and 3 (and many others), without a default system prompt. */
export const CHATML_TEMPLATE =
  "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message"
  + ".content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{-"
  + " '<|im_start|>assistant\\n' }}{%- endif %}";
